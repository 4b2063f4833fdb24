package sdk

import (
	"testing"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// TestTakeFillsFrames: what is pending goes out in frames of at most
// MaxFrame, oldest first.
func TestTakeFillsFrames(t *testing.T) {
	k := newSink()
	for range 2500 {
		if err := k.Send(t.Context(), Evidence{Kind: Renew, Device: "d"}); err != nil {
			t.Fatal(err)
		}
	}
	var sizes []int
	for k.len() > 0 {
		f := &pb.EvidenceFrame{}
		k.take(f)
		sizes = append(sizes, len(f.Evidence))
	}
	if len(sizes) != 3 || sizes[0] != MaxFrame || sizes[1] != MaxFrame || sizes[2] != 500 {
		t.Fatalf("frame sizes %v, want [1000 1000 500]", sizes)
	}
}
