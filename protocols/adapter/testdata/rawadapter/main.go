// Command rawadapter speaks the adapter contract without the SDK, so that
// a test can send what the SDK never would: its ready frame carries one
// renewal of device "raw-<i>" for each age_us of its config
// ({"age_us": [...]}), exactly as given, then the items of its config's
// "frame" (an EvidenceFrame in protobuf JSON); with "sent_ago_us" the
// frame says it was made that long before it is sent (sent_unix_us), as
// a frame that waited on its way. It writes each settlement
// it gets to stderr as "settled <id> <outcome> <reason>".
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

type server struct {
	pb.UnimplementedAdapterServer
	ages    []int64
	sentAgo int64
	frame   *pb.EvidenceFrame
}

var _ pb.AdapterServer = (*server)(nil)

func (s *server) Info(context.Context, *pb.InfoRequest) (*pb.InfoResponse, error) {
	return &pb.InfoResponse{Name: "rawadapter", Version: "1"}, nil
}

func (s *server) Configure(_ context.Context, r *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	var c struct {
		AgeUs   []int64         `json:"age_us"`
		SentAgo int64           `json:"sent_ago_us"`
		Frame   json.RawMessage `json:"frame"`
	}
	if err := json.Unmarshal(r.GetConfig(), &c); err != nil {
		return nil, err
	}
	s.ages, s.sentAgo = c.AgeUs, c.SentAgo
	s.frame = &pb.EvidenceFrame{}
	if len(c.Frame) > 0 {
		if err := protojson.Unmarshal(c.Frame, s.frame); err != nil {
			return nil, err
		}
	}
	return &pb.ConfigureResponse{}, nil
}

func (s *server) Evidence(_ *pb.EvidenceRequest, stream grpc.ServerStreamingServer[pb.EvidenceFrame]) error {
	f := &pb.EvidenceFrame{Ready: true}
	if s.sentAgo > 0 {
		f.SentUnixUs = time.Now().UnixMicro() - s.sentAgo
	}
	for i, age := range s.ages {
		f.Evidence = append(f.Evidence, &pb.Evidence{Kind: pb.Kind_KIND_RENEW, Device: "raw-" + strconv.Itoa(i), AgeUs: age})
	}
	f.Evidence = append(f.Evidence, s.frame.GetEvidence()...)
	if err := stream.Send(f); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (s *server) Settle(_ context.Context, r *pb.SettleRequest) (*pb.SettleResponse, error) {
	for _, st := range r.GetSettlements() {
		fmt.Fprintf(os.Stderr, "settled %d %s %s\n", st.GetId(), st.GetOutcome(), st.GetReason())
	}
	return &pb.SettleResponse{}, nil
}

func (s *server) Health(context.Context, *pb.HealthRequest) (*pb.HealthResponse, error) {
	return &pb.HealthResponse{Status: "ok"}, nil
}

func (s *server) Shutdown(context.Context, *pb.ShutdownRequest) (*pb.ShutdownResponse, error) {
	return &pb.ShutdownResponse{}, nil
}

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  pb.Handshake,
		VersionedPlugins: pb.VersionedPlugins(&server{}),
		GRPCServer:       plugin.DefaultGRPCServer,
	})
}
