package coap

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// socketDrops counts the datagrams the kernel dropped for one UDP socket
// because its receive buffer was full: the drops no read loop sees. Linux
// lists them per socket in the last column of /proc/net/udp (and udp6),
// found by the socket's inode.
type socketDrops struct {
	inode uint64
	last  atomic.Uint64 // the last value read, kept when a read fails
}

func newSocketDrops(c *net.UDPConn) (*socketDrops, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("socket drops: %w", err)
	}
	var st syscall.Stat_t
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = syscall.Fstat(int(fd), &st) }); err != nil {
		return nil, fmt.Errorf("socket drops: %w", err)
	}
	if serr != nil {
		return nil, fmt.Errorf("socket drops: %w", serr)
	}
	return &socketDrops{inode: st.Ino}, nil
}

// count reads the socket's drops; on a failed read it returns the last
// value, so that the counter never goes back.
func (d *socketDrops) count() float64 {
	for _, path := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		n, err := d.read(path)
		if err == nil {
			d.last.Store(n)
			break
		}
	}
	return float64(d.last.Load())
}

var errSocketNotListed = errors.New("socket not listed")

func (d *socketDrops) read(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	inode := strconv.FormatUint(d.inode, 10)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
		fields := strings.Fields(sc.Text())
		if len(fields) >= 13 && fields[9] == inode {
			return strconv.ParseUint(fields[12], 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errSocketNotListed
}
