package adapter_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/protocols/adapter"
)

// series gathers reg as "name{label=value,...} value" lines, sorted.
func series(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out = append(out, fmt.Sprintf("%s{%s} %g", mf.GetName(), strings.Join(labels, ","), v))
		}
	}
	sort.Strings(out)
	return out
}

// Every series of an adapter exists from its start, at zero but for up,
// so that the first restart counts in increase(); removing the adapter
// removes them all.
func TestMetricsFromTheStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newHost(t, func(o *adapter.Options) { o.Registerer = reg })
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("line", freeUDP(t))}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"fleetgate_adapter_commands_total{adapter=line,result=delivered} 0",
		"fleetgate_adapter_commands_total{adapter=line,result=failed} 0",
		"fleetgate_adapter_commands_total{adapter=line,result=refused} 0",
		"fleetgate_adapter_data_total{adapter=line,result=discarded} 0",
		"fleetgate_adapter_data_total{adapter=line,result=dropped} 0",
		"fleetgate_adapter_data_total{adapter=line,result=failed} 0",
		"fleetgate_adapter_data_total{adapter=line,result=published} 0",
		"fleetgate_adapter_data_total{adapter=line,result=refused} 0",
		"fleetgate_adapter_data_total{adapter=line,result=rejected} 0",
		"fleetgate_adapter_evidence_total{adapter=line,result=accepted} 0",
		"fleetgate_adapter_evidence_total{adapter=line,result=dropped} 0",
		"fleetgate_adapter_evidence_total{adapter=line,result=refused} 0",
		"fleetgate_adapter_evidence_total{adapter=line,result=rejected} 0",
		"fleetgate_adapter_failed{adapter=line} 0",
		"fleetgate_adapter_leases_clamped_total{adapter=line} 0",
		"fleetgate_adapter_restarts_total{adapter=line} 0",
		"fleetgate_adapter_up{adapter=line} 1",
	}
	if got := series(t, reg); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("series of a running adapter:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if err := e.host.Apply(ctx(t), nil); err != nil {
		t.Fatal(err)
	}
	if got := series(t, reg); len(got) != 0 {
		t.Fatalf("series left after the adapter was removed: %v", got)
	}
}
