package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/gateway"
)

// systemdUnit is the unit whose main process `devices add/rotate/remove`
// signals to reload the devices file.
const systemdUnit = "fleetgate.service"

var _ admin.Credentials = (*credentialsAPI)(nil)

// credentialsAPI is the gateway's side of POST and DELETE
// /v1/credentials/{id}: it edits auth.devices_file (auth.Edit) and makes
// the new set current at once, ending the sessions of the devices it
// removed or whose secrets it replaced, as a reload does.
type credentialsAPI struct {
	g   *gatewayProcess
	log *slog.Logger
	mu  sync.Mutex // one edit and its reload at a time
}

func (c *credentialsAPI) PutCredentials(device gateway.DeviceID, req admin.CredentialRequest) (admin.CredentialResult, error) {
	s := auth.Secrets{PSK: req.PSK, PasswordHash: req.PasswordBcrypt, Lease: req.Lease}
	res := admin.CredentialResult{Device: device}
	if req.PSK == admin.GeneratePSK {
		psk, err := auth.GeneratePSK()
		if err != nil {
			return res, err
		}
		s.PSK, res.PSK = psk, psk
	}
	if req.Password != "" {
		hash, err := auth.HashPassword([]byte(req.Password), defaultHashCost)
		if err != nil {
			return res, fmt.Errorf("%w: %w", admin.ErrBadCredentials, err)
		}
		s.PasswordHash = hash
	}
	d, err := c.edit(auth.Add, device, s)
	if errors.Is(err, auth.ErrExists) {
		d, err = c.edit(auth.Rotate, device, s)
	} else {
		res.Created = err == nil
	}
	if err != nil {
		return admin.CredentialResult{}, err
	}
	c.log.Info("device credentials set through the admin API", "device", device, "created", res.Created, "devices", d.Len())
	return res, nil
}

func (c *credentialsAPI) DeleteCredentials(device gateway.DeviceID) error {
	d, err := c.edit(auth.Remove, device, auth.Secrets{})
	if err != nil {
		return err
	}
	c.log.Info("device credentials removed through the admin API", "device", device, "devices", d.Len())
	return nil
}

// edit edits the devices file and makes the result the current set.
func (c *credentialsAPI) edit(op auth.Op, device gateway.DeviceID, s auth.Secrets) (*auth.Devices, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cfg := c.g.config()
	d, err := auth.Edit(cfg.Auth.DevicesFile, op, device, s, leaseBounds(cfg))
	switch {
	case errors.Is(err, auth.ErrAbsent):
		return nil, fmt.Errorf("%w: %w", admin.ErrNoCredentials, err)
	case errors.Is(err, auth.ErrInvalid):
		return nil, fmt.Errorf("%w: %w", admin.ErrBadCredentials, err)
	case err != nil:
		return nil, err
	}
	c.g.creds.Set(d)
	c.g.revoke()
	return d, nil
}

// devicesEdit runs `devices add`, `devices rotate` and `devices remove`:
// it edits the devices file of the configuration (auth.Edit: atomic,
// validated as run loads it) and has the running gateway reload it
// (SIGHUP to --pid, else to the main process of fleetgate.service).
func devicesEdit(ctx context.Context, op auth.Op, args []string, stdout, stderr io.Writer) error {
	verb := map[auth.Op]string{auth.Add: "add", auth.Rotate: "rotate", auth.Remove: "remove"}[op]
	synopsis := "devices " + verb + " [-c FILE] [--pid PID | --no-reload] ID"
	switch op {
	case auth.Add:
		synopsis = "devices add [-c FILE] [--psk-gen | --psk-file F] [--password-prompt] [--lease D] [--pid PID | --no-reload] ID"
	case auth.Rotate:
		synopsis = "devices rotate [-c FILE] [--psk-gen | --psk-file F] [--password-prompt] [--lease D | --lease none] [--pid PID | --no-reload] ID"
	}
	fs, path := newFlags("devices "+verb, synopsis)
	pid := fs.Int("pid", 0, "signal (SIGHUP) this `PID` to reload the devices file (default: the main process of "+systemdUnit+")")
	noReload := fs.Bool("no-reload", false, "edit the file only; the gateway reads it at its next start or SIGHUP")
	var pskGen, pwPrompt *bool
	var pskFile *string
	lease := new(string)
	switch op {
	case auth.Add:
		lease = fs.String("lease", "", "give the device a lease of its own, `D` (a duration such as 2h), within presence.lease and presence.max_lease: for a device that sends less often than the heartbeat interval")
	case auth.Rotate:
		lease = fs.String("lease", "", "set the device's own lease to `D` (a duration such as 2h), or remove it with \""+auth.NoLease+"\"; given alone, the device keeps its secrets")
	}
	if op != auth.Remove {
		pskGen = fs.Bool("psk-gen", false, "give the device a new random 32-byte pre-shared key, printed once on standard output (the default when no secret is given)")
		pskFile = fs.String("psk-file", "", "read the pre-shared key from `F` (\"hex:..\", \"base64:..\" or \"text:..\", as in the devices file)")
		pwPrompt = fs.Bool("password-prompt", false, "set the MQTT password: prompted twice on a terminal, else the first line of standard input; stored as its bcrypt hash")
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: want exactly one device ID", errUsage)
	}
	device, err := gateway.ParseDeviceID(fs.Arg(0))
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *noReload && *pid != 0 {
		return fmt.Errorf("%w: --pid and --no-reload exclude each other", errUsage)
	}
	var s auth.Secrets
	generated := false
	if op != auth.Remove {
		if *pskGen && *pskFile != "" {
			return fmt.Errorf("%w: --psk-gen and --psk-file exclude each other", errUsage)
		}
		if *pskFile != "" {
			b, err := os.ReadFile(*pskFile)
			if err != nil {
				return fmt.Errorf("--psk-file: %w", err)
			}
			s.PSK = strings.TrimSpace(string(b))
		}
		if *lease != "" && (op == auth.Add || *lease != auth.NoLease) {
			if _, err := auth.ParseLease(*lease); err != nil {
				return fmt.Errorf("%w: --lease: %v", errUsage, err)
			}
		}
		if *pwPrompt {
			pw, err := readPassword(stderr)
			defer clear(pw)
			if err != nil {
				return err
			}
			if s.PasswordHash, err = auth.HashPassword(pw, defaultHashCost); err != nil {
				return err
			}
		}
	}
	cfg, err := parseAndLoad(fs, nil, path)
	if err != nil {
		return err
	}
	file := cfg.Auth.DevicesFile
	if file == "" {
		return configError{fmt.Errorf("%s: auth.devices_file is empty: there is no devices file to edit", *path)}
	}
	leaseOnly := op == auth.Rotate && *lease != "" && s == (auth.Secrets{}) && !*pskGen
	if op != auth.Remove && !leaseOnly && (*pskGen || s == (auth.Secrets{})) {
		if op == auth.Rotate && !*pskGen {
			// no secret named: rotate the key, of a device that has one
			if cur, err := auth.Load(file); err == nil && cur.Revision(device) != "" {
				if _, _, err := cur.PSK([]byte(device)); err != nil {
					return fmt.Errorf("%w: device %s has no psk to rotate: give --password-prompt for its password, or --psk-gen to give it a key", errUsage, device)
				}
			}
		}
		if s.PSK, err = auth.GeneratePSK(); err != nil {
			return err
		}
		generated = true
	}
	s.Lease = *lease
	d, err := auth.Edit(file, op, device, s, leaseBounds(cfg))
	if err != nil {
		return err
	}
	if generated {
		fmt.Fprintln(stdout, s.PSK) // the only time the key is shown
	}
	fmt.Fprintf(stderr, "device %s: %s in %s (%d devices)\n", device, map[auth.Op]string{auth.Add: "added", auth.Rotate: "rotated", auth.Remove: "removed"}[op], file, d.Len())
	if *noReload {
		fmt.Fprintln(stderr, "not reloaded (--no-reload): the gateway reads the file at its next start or SIGHUP")
		return nil
	}
	target, err := gatewayPID(ctx, *pid)
	if err != nil {
		return fmt.Errorf("the devices file was changed, but no gateway was told: %w; send it SIGHUP (systemctl reload fleetgate) or pass --pid", err)
	}
	if err := syscall.Kill(target, syscall.SIGHUP); err != nil {
		return fmt.Errorf("the devices file was changed, but reloading the gateway (SIGHUP to pid %d) failed: %w", target, err)
	}
	fmt.Fprintf(stderr, "sent SIGHUP to the gateway (pid %d): it reloads the devices file and ends the sessions of the devices whose entry changed\n", target)
	return nil
}

// gatewayPID is pid when given, else the main process of systemdUnit.
func gatewayPID(ctx context.Context, pid int) (int, error) {
	if pid != 0 {
		return pid, nil
	}
	out, err := exec.CommandContext(ctx, "systemctl", "show", "--property=MainPID", "--value", systemdUnit).Output()
	if err != nil {
		return 0, fmt.Errorf("systemctl show %s: %w", systemdUnit, err)
	}
	main, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || main <= 0 {
		return 0, fmt.Errorf("%s is not running", systemdUnit)
	}
	return main, nil
}

// devicesForget runs `devices forget`: the running gateway's store
// forgets the device (DELETE /v1/devices/{id}, which needs the admin
// API's token).
func devicesForget(ctx context.Context, args []string, stdout, _ io.Writer) error {
	q := newQueryFlags("devices forget", "devices forget [-c FILE] [--addr HOST:PORT] [--token-file FILE] [--json] ID")
	if err := q.parseOneID(args); err != nil {
		return err
	}
	c, err := q.client()
	if err != nil {
		return err
	}
	env, err := c.Forget(ctx, q.fs.Arg(0))
	if err != nil {
		return explain(err)
	}
	if *q.json {
		return printJSON(stdout, env)
	}
	fmt.Fprintf(stdout, "device %s forgotten: its last event is removed ver=%d\n", env.Device, env.Ver)
	return nil
}
