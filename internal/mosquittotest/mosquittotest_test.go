package mosquittotest

import (
	"io"
	"net"
	"testing"
	"time"
)

// connack sends an MQTT 3.1.1 CONNECT to addr (with user and password
// when user is set) and returns the CONNACK's return code.
func connack(t *testing.T, addr, user, password string) byte {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	str := func(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }
	body := append(str("MQTT"), 4, 0x02, 0, 30) // 3.1.1, clean session, keep-alive 30 s
	body = append(body, str("mosquittotest")...)
	if user != "" {
		body[7] |= 0xc0 // the flags: user name and password
		body = append(body, str(user)...)
		body = append(body, str(password)...)
	}
	if _, err := c.Write(append([]byte{0x10, byte(len(body))}, body...)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	ack := make([]byte, 4)
	if _, err := io.ReadFull(c, ack); err != nil || ack[0] != 0x20 {
		t.Fatalf("CONNACK: %x, %v", ack, err)
	}
	return ack[3]
}

func TestAnonymousStopStart(t *testing.T) {
	b := Start(t, Options{})
	if rc := connack(t, b.Addr, "", ""); rc != 0 {
		t.Fatalf("anonymous CONNECT: return code %d", rc)
	}
	b.Stop()
	if c, err := net.DialTimeout("tcp", b.Addr, time.Second); err == nil {
		c.Close()
		t.Fatal("the stopped broker still accepts connections")
	}
	b.Start()
	if rc := connack(t, b.Addr, "", ""); rc != 0 {
		t.Fatalf("anonymous CONNECT after Start: return code %d", rc)
	}
	b.Kill()
	b.Kill()
}

func TestPasswordFile(t *testing.T) {
	b := Start(t, Options{User: "publisher", Password: "s3cret"})
	if rc := connack(t, b.Addr, "publisher", "s3cret"); rc != 0 {
		t.Fatalf("CONNECT with the password: return code %d", rc)
	}
	if rc := connack(t, b.Addr, "publisher", "wrong"); rc != 5 {
		t.Fatalf("CONNECT with a wrong password: return code %d, want 5 (not authorized)", rc)
	}
	if rc := connack(t, b.Addr, "", ""); rc != 5 {
		t.Fatalf("anonymous CONNECT: return code %d, want 5 (not authorized)", rc)
	}
}
