package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/bridge"
	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/protocols/mqtt"
	"github.com/fleetgate/fleetgate/queue/diskq"
	"github.com/fleetgate/fleetgate/queue/memq"
)

// bridgeFile holds the data path's durable queues in gateway.state_dir:
// the QoS 1 messages waiting for the upstream broker (bucket "up") and
// the pending commands (bucket "commands"). A file apart from the state
// file, so that its commits never wait on the presence outbox's.
const bridgeFile = "bridge.db"

// commandsMaxBytes bounds the pending commands' queue (the bound per
// device, bridge.commands.max_pending_per_device, comes first).
const commandsMaxBytes = 64 << 20

// dataPath is the bridge and what it owns.
type dataPath struct {
	db       *bolt.DB
	up, cmds *diskq.Queue
	mem      *memq.Queue
	bridge   *bridge.Bridge
	// local is the MQTT front end local consumers read from, once it is
	// open (nil without an MQTT listener).
	local atomic.Pointer[mqtt.Server]
}

// openDataPath opens bridge.db, the queues and the bridge (docs/design.md
// §6.14). The bridge runs in every gateway: device messages reach local
// consumers and commands reach devices also without an upstream broker.
func openDataPath(ctx context.Context, cfg configs.Config, log *slog.Logger, reg prometheus.Registerer) (_ *dataPath, err error) {
	b := cfg.Bridge
	dp := &dataPath{}
	defer func() {
		if err != nil {
			err = errors.Join(err, dp.close())
		}
	}()
	if dp.db, err = diskq.OpenFile(filepath.Join(cfg.Gateway.StateDir, bridgeFile)); err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	if dp.up, err = diskq.OpenDB(dp.db, diskq.Options{Bucket: "up", MaxBytes: int64(b.Queue.MaxBytes), MaxAge: b.Queue.MaxAge.Std(),
		CommitInterval: b.Queue.CommitInterval.Std(), Clock: gateway.SystemClock{}, Logger: log}); err != nil {
		return nil, fmt.Errorf("bridge: queue: %w", err)
	}
	if dp.cmds, err = diskq.OpenDB(dp.db, diskq.Options{Bucket: "commands", MaxBytes: commandsMaxBytes, MaxAge: b.Commands.TTL.Std(),
		CommitInterval: b.Queue.CommitInterval.Std(), Clock: gateway.SystemClock{}, Logger: log}); err != nil {
		return nil, fmt.Errorf("bridge: commands: %w", err)
	}
	if dp.mem, err = memq.New(memq.Options{MaxBytes: int64(b.Queue.MemoryBytes), MaxAge: b.Queue.MaxAge.Std(), Clock: gateway.SystemClock{}}); err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	tc, err := clientTLS("bridge.mqtt.tls", b.MQTT.TLS.CA, b.MQTT.TLS.Cert, b.MQTT.TLS.Key, b.MQTT.TLS.ServerName)
	if err != nil {
		return nil, err
	}
	dp.bridge, err = bridge.New(ctx, bridge.Options{
		GatewayID: cfg.Gateway.ID, URL: b.MQTT.URL, ClientID: b.MQTT.ClientID,
		Username: b.MQTT.Username, Password: b.MQTT.Password, TLS: tc, ProtocolVersion: byte(b.MQTT.ProtocolVersion),
		TopicPrefix: b.MQTT.Prefix(cfg.Gateway.ID), Up: cfg.UpFilters(), Down: b.MQTT.Down, LocalPrefix: cfg.Auth.TopicPrefix,
		Durable: dp.up, Memory: dp.mem, Commands: dp.cmds,
		CommandTTL: b.Commands.TTL.Std(), MaxPendingPerDevice: b.Commands.MaxPendingPerDevice,
		Local: dp.publishLocal, Clock: gateway.SystemClock{}, Logger: log, Registerer: reg,
	})
	if err != nil {
		return nil, err
	}
	if b.MQTT.Enabled() {
		log.Info("forwarding device messages to an upstream broker", "url", b.MQTT.URL, "topic_prefix", b.MQTT.Prefix(cfg.Gateway.ID), "down", b.MQTT.Down)
	}
	return dp, nil
}

// publishLocal hands a device's message to the local MQTT consumers.
func (dp *dataPath) publishLocal(topic string, m gateway.Message) error {
	if s := dp.local.Load(); s != nil {
		return s.PublishLocal(topic, m)
	}
	return nil
}

// close stops the bridge, then closes its queues and file (what was
// opened of them).
func (dp *dataPath) close() error {
	var errs []error
	if dp.bridge != nil {
		errs = append(errs, dp.bridge.Close())
	}
	if dp.up != nil {
		errs = append(errs, dp.up.Close())
	}
	if dp.cmds != nil {
		errs = append(errs, dp.cmds.Close())
	}
	if dp.mem != nil {
		errs = append(errs, dp.mem.Close())
	}
	if dp.db != nil {
		errs = append(errs, dp.db.Close())
	}
	return errors.Join(errs...)
}

// localClients are auth.clients for the MQTT front end, and their
// passwords (nil, nil when there are none).
func localClients(cfg configs.Config) ([]mqtt.LocalClient, *auth.Devices, error) {
	if len(cfg.Auth.Clients) == 0 {
		return nil, nil, nil
	}
	hashes := make(map[string]string, len(cfg.Auth.Clients))
	clients := make([]mqtt.LocalClient, 0, len(cfg.Auth.Clients))
	for _, c := range cfg.Auth.Clients {
		hashes[c.Name] = c.PasswordBcrypt
		clients = append(clients, mqtt.LocalClient{Name: c.Name, Read: c.Read, Write: c.Write})
	}
	pw, err := auth.NewPasswords(hashes)
	if err != nil {
		return nil, nil, fmt.Errorf("auth.clients: %w", err)
	}
	return clients, pw, nil
}

// reloadClients applies auth.clients of next to the MQTT front end: the
// connected local clients whose entry changed or went away are
// disconnected; an invalid list keeps the clients in force.
func (g *gatewayProcess) reloadClients(next configs.Config, log *slog.Logger) {
	clients, pw, err := localClients(next)
	if err != nil {
		log.Error("auth.clients not reloaded; keeping the clients in use", "err", err)
		return
	}
	var passwords gateway.Credentials
	if pw != nil {
		if g.clients == nil {
			g.clients = auth.NewReloadable(pw)
		} else {
			g.clients.Set(pw)
		}
		passwords = g.clients
	}
	if err := g.mqtt.SetClients(clients, passwords); err != nil {
		log.Error("auth.clients not reloaded; keeping the clients in use", "err", err)
		return
	}
	log.Info("local clients reloaded", "clients", len(clients))
}
