package mqtt

import (
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetgate/fleetgate/gateway"
)

// An MQTT 5 client with a session expiry interval is a sleepy device: its
// normal DISCONNECT is not a leave, every connection of it renews one
// presence session "<gateway>/mqtt", and a DISCONNECT that sets the
// session expiry to 0 ends it.
func TestV5SleepyDevice(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{Credentials: testCreds(t)})
	const sleepy = gateway.SessionID("gw-1/mqtt")
	expiry := uint32(3600)
	connect := func() *v5 {
		c, ack, err := connectV5(t, tcpAddr(s), nil, &paho.Connect{
			ClientID: "dev-1", KeepAlive: 30, CleanStart: false,
			Password: []byte("secret-1"), PasswordFlag: true,
			Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry},
		})
		if err != nil {
			t.Fatalf("connect: %v (connack %v)", err, ack)
		}
		return c
	}
	for wake := 1; wake <= 3; wake++ {
		c := connect()
		if got := rec.SessionOf("dev-1"); got != sleepy {
			t.Fatalf("wake %d: session %s, want %s", wake, got, sleepy)
		}
		if err := c.Disconnect(&paho.Disconnect{ReasonCode: 0}); err != nil {
			t.Fatalf("disconnect: %v", err)
		}
		eventually(t, 5*time.Second, "connection ended", func() bool { return s.conns.Load() == 0 })
		if n := rec.Count(sleepy, gateway.Connect); n != wake {
			t.Fatalf("wake %d: %d connects of %s", wake, n, sleepy)
		}
		if n := rec.Count(sleepy, gateway.Leave); n != 0 {
			t.Fatalf("wake %d: a sleepy device's DISCONNECT made %d leaves", wake, n)
		}
	}
	// Session expiry 0 on DISCONNECT: the client ends its session.
	c := connect()
	zero := uint32(0)
	if err := c.Disconnect(&paho.Disconnect{ReasonCode: 0, Properties: &paho.DisconnectProperties{SessionExpiryInterval: &zero}}); err != nil {
		t.Fatalf("disconnect: %v", err)
	}
	eventually(t, 5*time.Second, "leave", func() bool { return rec.Count(sleepy, gateway.Leave) == 1 })

	// A client without a session expiry still leaves on DISCONNECT.
	c = mustConnectV5(t, s, "dev-1", "secret-1")
	plain := rec.SessionOf("dev-1")
	if plain == sleepy {
		t.Fatalf("clean client got the persistent session %s", plain)
	}
	if err := c.Disconnect(&paho.Disconnect{ReasonCode: 0}); err != nil {
		t.Fatalf("disconnect: %v", err)
	}
	eventually(t, 5*time.Second, "leave", func() bool { return rec.Count(plain, gateway.Leave) == 1 })
}

// A 3.1.1 client with clean session = 0 is a sleepy device alike; a later
// connection of it with clean session = 1 discards the persistent session,
// which ends its presence session (after the new one began, so the device
// stays online throughout).
func TestV311SleepyDevice(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{Credentials: testCreds(t)})
	const sleepy = gateway.SessionID("gw-1/mqtt")
	connect := func(clean bool) paho3.Client {
		o := paho3.NewClientOptions().AddBroker("tcp://" + tcpAddr(s)).SetClientID("dev-2").
			SetProtocolVersion(4).SetCleanSession(clean).SetAutoReconnect(false).
			SetConnectTimeout(10 * time.Second).SetUsername("dev-2").SetPassword("secret-2")
		c := paho3.NewClient(o)
		if tok := c.Connect(); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
			t.Fatalf("connect (clean %v): %v", clean, tok.Error())
		}
		t.Cleanup(func() {
			if c.IsConnected() {
				c.Disconnect(0)
			}
		})
		return c
	}
	for wake := 1; wake <= 2; wake++ {
		c := connect(false)
		if got := rec.SessionOf("dev-2"); got != sleepy {
			t.Fatalf("wake %d: session %s, want %s", wake, got, sleepy)
		}
		if tok := c.Publish("devices/dev-2/temp", 1, false, "21.5"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
		c.Disconnect(100)
		eventually(t, 5*time.Second, "connection ended", func() bool { return s.conns.Load() == 0 })
		if n := rec.Count(sleepy, gateway.Leave); n != 0 {
			t.Fatalf("wake %d: clean session 0 DISCONNECT made %d leaves", wake, n)
		}
	}
	if n := rec.Count(sleepy, gateway.Connect); n != 2 {
		t.Fatalf("%d connects of %s, want 2", n, sleepy)
	}
	c := connect(true)
	plain := rec.SessionOf("dev-2")
	if plain == sleepy {
		t.Fatal("clean session 1 got the persistent session")
	}
	eventually(t, 5*time.Second, "persistent session ended", func() bool { return rec.Count(sleepy, gateway.Leave) == 1 })
	evs := rec.Evidence()
	iConnect, iLeave := -1, -1
	for i, ev := range evs {
		switch {
		case ev.Session == plain && ev.Kind == gateway.Connect:
			iConnect = i
		case ev.Session == sleepy && ev.Kind == gateway.Leave:
			iLeave = i
		}
	}
	if iConnect > iLeave {
		t.Fatalf("the persistent session's leave (%d) came before the new session's connect (%d)", iLeave, iConnect)
	}
	c.Disconnect(100)
	eventually(t, 5*time.Second, "leave", func() bool { return rec.Count(plain, gateway.Leave) == 1 })
}
