package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/internal/testcert"
)

// -update-screenshots writes the page's screenshots (docs/screenshots)
// from TestPageInBrowser: `make screenshots`.
var updateScreenshots = flag.Bool("update-screenshots", false, "write docs/screenshots/*.png from TestPageInBrowser")

// cspProbe runs in every document before its own scripts (through the
// DevTools protocol, which the page's CSP does not govern) and records
// each Content-Security-Policy violation the browser reports.
const cspProbe = `window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));`

// pageBrowser is a headless Debian chromium driven by chromedp, with
// every console message, exception and browser log entry recorded.
type pageBrowser struct {
	t     *testing.T
	ctx   context.Context
	mu    sync.Mutex
	log   []chromedp.ConsoleMessage
	watch []int64 // the status of each /v1/watch answer
	reqs  []pageRequest
	// foreign holds the requests the page made outside its own assets,
	// its login and the public API (checkClean fails on any).
	foreign []string
}

// pageRequest is a request of the page to the API: its path and query,
// and when the browser sent it.
type pageRequest struct {
	url string
	at  time.Time
}

func newPageBrowser(t *testing.T) *pageBrowser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium: %v (make deps installs Debian's chromium)", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		tctx, tcancel := context.WithTimeout(ctx, 10*time.Second)
		defer tcancel()
		_ = chromedp.Cancel(tctx)
		cancel()
		cancelAlloc()
	})
	b := &pageBrowser{t: t, ctx: ctx}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.log = append(b.log, m)
			b.mu.Unlock()
		}
	}()
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: cspProbe}); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	if err := chromedp.Listen(ctx, func(ev any) {
		switch e := ev.(type) {
		case *network.EventResponseReceived:
			if strings.Contains(e.Response.URL, "/v1/watch") {
				b.mu.Lock()
				b.watch = append(b.watch, e.Response.Status)
				b.mu.Unlock()
			}
		case *network.EventRequestWillBeSent:
			if _, path, ok := strings.Cut(e.Request.URL, "/v1/"); ok {
				b.mu.Lock()
				b.reqs = append(b.reqs, pageRequest{url: "/v1/" + path, at: time.Now()})
				b.mu.Unlock()
			}
			if !pageOwnRequest(e.Request.URL) {
				b.mu.Lock()
				b.foreign = append(b.foreign, e.Request.Method+" "+e.Request.URL)
				b.mu.Unlock()
			}
		}
	}); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return b
}

// requested reports whether the page asked, at or after since, for a
// URL that starts with prefix (a path, maybe with a query) and holds
// each of parts.
func (b *pageBrowser) requested(prefix string, since time.Time, parts ...string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.reqs {
		ok := strings.HasPrefix(r.url, prefix) && !r.at.Before(since)
		for _, p := range parts {
			ok = ok && strings.Contains(r.url, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// do runs actions, bounded by limit.
func (b *pageBrowser) do(limit time.Duration, what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, limit)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v\n%s", what, err, b.console())
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](b *pageBrowser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// poll waits (bounded) until the expression is truthy in the page.
func (b *pageBrowser) poll(limit time.Duration, what, expr string) {
	b.t.Helper()
	b.do(limit+5*time.Second, what, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(limit))(ctx, t)
		return err
	}))
}

// pollShowing is poll that, when it times out, fails with the value of
// the expression show in the page (what the page showed instead).
func (b *pageBrowser) pollShowing(limit time.Duration, what, expr, show string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, limit+5*time.Second)
	defer cancel()
	err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(limit))(ctx, t)
		return err
	}))
	if err != nil {
		b.t.Fatalf("%s: %v; the page shows %s\n%s", what, err, eval[string](b, show), b.console())
	}
}

// errors are the console messages of level error and the uncaught
// exceptions, but those for which allowed says true.
func (b *pageBrowser) errors(allowed func(chromedp.ConsoleMessage) bool) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, m := range b.log {
		if (m.Type == chromedp.ConsoleError || m.IsException()) && (allowed == nil || !allowed(m)) {
			out = append(out, fmt.Sprintf("%s %s (%s:%d)", m.Type, m.Text, m.URL, m.Line))
		}
	}
	return out
}

func (b *pageBrowser) console() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var s []string
	for _, m := range b.log {
		s = append(s, m.String())
	}
	return strings.Join(s, "\n")
}

// checkClean fails the test on a console error, an exception or a CSP
// violation the page caused.
func (b *pageBrowser) checkClean(allowed func(chromedp.ConsoleMessage) bool) {
	b.t.Helper()
	if errs := b.errors(allowed); len(errs) > 0 {
		b.t.Errorf("console errors: %d\n%s", len(errs), strings.Join(errs, "\n"))
	}
	if v := eval[[]string](b, `window.__csp`); len(v) > 0 {
		b.t.Errorf("CSP violations: %d: %v", len(v), v)
	}
	b.mu.Lock()
	foreign := slices.Clone(b.foreign)
	b.mu.Unlock()
	if len(foreign) > 0 {
		b.t.Errorf("the page asked for more than its assets, its login and /v1/*: %v", foreign)
	}
}

// lowContrast lists the page's visible text whose contrast against its
// background is below WCAG 2's AA level: 4.5:1, 3:1 for large text
// (24 px, or 18.66 px bold). A background is the nearest ancestor's
// that is not transparent, translucent ones laid over the one below.
const lowContrast = `(() => {
	const rgba = (c) => { const m = c.match(/[\d.]+/g).map(Number); return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; };
	const over = (top, below) => top.slice(0, 3).map((v, i) => v * top[3] + below[i] * (1 - top[3])).concat(1);
	const bg = (e) => {
		const layers = [];
		for (; e && e.nodeType === 1; e = e.parentElement) {
			const c = rgba(getComputedStyle(e).backgroundColor);
			if (c[3] > 0) { layers.push(c); if (c[3] === 1) break; }
		}
		return layers.reduceRight((below, top) => over(top, below), [255, 255, 255, 1]);
	};
	const lum = (c) => { const l = c.slice(0, 3).map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
		return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2]; };
	const low = [];
	for (const e of document.querySelectorAll('body *')) {
		if (e.disabled || e.closest('[disabled]') || !e.getClientRects().length) continue;
		if (![...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
		const st = getComputedStyle(e);
		if (st.visibility !== 'visible' || Number(st.opacity) === 0) continue;
		const back = bg(e), fore = over(rgba(st.color), back);
		const [a, b] = [lum(fore), lum(back)].sort((x, y) => y - x), ratio = (a + 0.05) / (b + 0.05);
		const size = parseFloat(st.fontSize), large = size >= 24 || (size >= 18.66 && Number(st.fontWeight) >= 700);
		if (ratio < (large ? 3 : 4.5)) low.push(e.tagName + ' "' + e.textContent.trim().slice(0, 30) + '" ' + ratio.toFixed(2));
	}
	return low;
})()`

// pageOwnRequest says whether the page's request for raw is one of its
// own: its document, its assets (/ui/), its login and logout, or the
// public API (/v1/), on the loopback gateway the tests open it on.
func pageOwnRequest(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Hostname() != "127.0.0.1" {
		return false
	}
	switch p := u.Path; {
	case p == "/", p == "/login", p == "/logout", strings.HasPrefix(p, "/ui/"), strings.HasPrefix(p, "/v1/"):
		return true
	}
	return false
}

// pageStatus is the part of /v1/status the page's tests read.
type pageStatus struct {
	Sessions int               `json:"sessions"`
	Bounds   map[string]string `json:"bounds"`
}

func readPageStatus(t *testing.T, admin string) pageStatus {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st pageStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// The page against a gateway on the embedded store with a simulated
// fleet of 1,000 CoAP and MQTT devices and one more device of the test:
// the overview loads; a search finds that device by its ID and others by
// a prefix; when the device stops it turns offline on the page, without
// a reload, within the detection bound + 2 s; its page shows its
// sessions and its offline event; every field has a label, the keyboard
// reaches the search and nothing overflows 360 px; the whole visit writes no console
// error and violates the Content-Security-Policy nowhere, while the
// policy is in force (an inline style and script the test injects are
// refused and reported).
func TestPageInBrowser(t *testing.T) {
	const probe = "page-probe-1"
	// The cap on anonymous devices is raised above the fleet's 1,001 so
	// that none is refused (a refusal would show on the device's page).
	g := simGatewayLimits(t, "gw-page", "", simTiming, "limits: { coap_requests_per_second: 100000, mqtt_connects_per_second: 100000, anonymous_max_devices: 100000 }\n")
	g.start()

	fleet := exec.Command(binary, "simulate", "--coap", g.coapAddr, "--mqtt", g.mqttAddr, "--admin", g.admin,
		"--devices", "1000", "--duration", "2m", "--prefix", "pgsim-", "--heartbeat", "2s",
		"--lease", simTiming.lease.String(), "--renew-every", simTiming.renewEvery.String(),
		"--runner-interval", simTiming.runnerInterval.String(), "--flush-interval", simTiming.flush.String())
	fleet.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var fleetOut syncBuffer
	fleet.Stdout, fleet.Stderr = &fleetOut, &fleetOut
	if err := fleet.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fleet.Process.Kill()
		_ = fleet.Wait()
		if t.Failed() {
			t.Logf("simulate:\n%s", fleetOut.String())
		}
	})

	stop := device{t: t, id: probe}.keepSending(func() string { return g.coapAddr }, 500*time.Millisecond, 90*time.Second)
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	// The fleet churns (simulate's scenarios: leaves, freezes, moves), so
	// a few of its devices are away at any time.
	waitFor(t, 40*time.Second, "the simulated fleet and the probe on the gateway", func() bool {
		return readPageStatus(t, g.admin).Sessions >= 900
	})
	bound, err := time.ParseDuration(readPageStatus(t, g.admin).Bounds["worst_case_detection"])
	if err != nil {
		t.Fatal(err)
	}

	b := newPageBrowser(t)
	base := "http://" + g.admin + "/"
	b.do(20*time.Second, "open the page", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#overview")))
	b.poll(10*time.Second, "the gateway, the fleet's counts and a page of devices", `document.getElementById('gw-name').textContent === 'gw-page' &&
		document.querySelectorAll('#devices tbody tr[data-device]').length === 50 && document.getElementById('live').textContent === 'live' &&
		document.getElementById('counts-note').textContent.startsWith('Whole fleet') &&
		Number(document.getElementById('n-online').textContent.replace(',', '')) >= 900`)

	// Accessible: every field has a label; the keyboard reaches the
	// search from the top of the page; at 360 px nothing is wider than
	// the screen.
	if v := eval[[]string](b, `[...document.querySelectorAll('input, select')].filter((e) => !e.hidden && e.type !== 'hidden' && !(e.labels && e.labels.length)).map((e) => e.outerHTML)`); len(v) > 0 {
		t.Errorf("fields without a label: %v", v)
	}
	if v := eval[[]string](b, lowContrast); len(v) > 0 {
		t.Errorf("text below WCAG AA contrast on the overview: %v", v)
	}
	eval[bool](b, `document.activeElement.blur(), true`)
	for i := 0; i < 40 && eval[string](b, `document.activeElement.id`) != "q"; i++ {
		b.do(5*time.Second, "tab", chromedp.KeyEvent("\t"))
	}
	if id := eval[string](b, `document.activeElement.id`); id != "q" {
		t.Errorf("40 tabs from the top did not reach the search (focus on %q)", id)
	}
	b.do(10*time.Second, "a phone's width", chromedp.EmulateViewport(360, 780), chromedp.Sleep(200*time.Millisecond))
	if w := eval[int](b, `document.documentElement.scrollWidth`); w > 360 {
		t.Errorf("at 360 px the page is %d px wide", w)
	}
	b.do(10*time.Second, "a desktop's width", chromedp.EmulateViewport(1280, 900))

	// Search: an exact ID, then a prefix.
	b.do(10*time.Second, "search the probe", chromedp.SendKeys(chromedp.CSS("#q"), probe), chromedp.Click(chromedp.CSS("#filters button[type=submit]")))
	row := `document.querySelector('#devices tr[data-device="` + probe + `"]')`
	b.poll(10*time.Second, "the probe found, online", row+` && `+row+`.querySelector('.badge').textContent === 'online' && document.querySelectorAll('#devices tbody tr[data-device]').length === 1`)

	// Live: the probe stops; the page, not reloaded, shows it offline.
	eval[bool](b, `window.__notReloaded = true`)
	last := stop()
	stopped = true
	b.poll(bound+5*time.Second, "the probe offline on the page", row+`.querySelector('.badge').textContent === 'offline'`)
	took := time.Since(last)
	t.Logf("offline on the page %v after the probe's last heartbeat (bound %v)", took.Round(10*time.Millisecond), bound)
	if took > bound+2*time.Second {
		t.Errorf("offline shown %v after the last heartbeat, want within the bound %v + 2 s", took, bound)
	}
	if !eval[bool](b, `window.__notReloaded === true && [...document.querySelectorAll('#feed li')].some((li) => li.textContent.includes('`+probe+`') && li.textContent.includes('offline'))`) {
		t.Error("the page reloaded, or its live feed lacks the probe's offline event")
	}

	// The prefix search finds simulated devices, and only those.
	b.do(10*time.Second, "search a prefix", chromedp.SetValue(chromedp.CSS("#q"), "pgsim-1"), chromedp.Click(chromedp.CSS("#filters button[type=submit]")))
	b.poll(15*time.Second, "devices of the prefix", `document.getElementById('dev-caption').textContent.includes('matching “pgsim-1”')`)
	if ids := eval[[]string](b, `[...document.querySelectorAll('#devices tbody tr[data-device]')].map((r) => r.dataset.device)`); len(ids) == 0 {
		t.Error("the prefix search found nothing")
	} else {
		for _, id := range ids {
			if !strings.HasPrefix(id, "pgsim-1") {
				t.Errorf("prefix search pgsim-1 shows %s", id)
			}
		}
	}
	if *updateScreenshots {
		eval[string](b, `document.getElementById('q').value = ''`)
		b.do(10*time.Second, "back to the table", chromedp.Click(chromedp.CSS("#filters button[type=submit]")))
		b.poll(10*time.Second, "the table", `document.querySelectorAll('#devices tbody tr[data-device]').length === 50`)
		b.screenshots("overview")
		online := eval[string](b, `[...document.querySelectorAll('#devices tbody tr[data-device]')].find((r) => r.querySelector('.badge').textContent === 'online').dataset.device`)
		b.do(10*time.Second, "open an online device's page", chromedp.Navigate(base+"#/device/"+online), chromedp.WaitVisible(chromedp.CSS("#device")))
		b.poll(10*time.Second, "its page", `document.getElementById('dev-h').textContent === '`+online+`' && document.querySelector('#dev-events li')`)
		b.screenshots("device")
	}

	// The probe's page: its store record, its local session, its events.
	b.do(10*time.Second, "open the probe's page", chromedp.Navigate(base+"#/device/"+probe), chromedp.WaitVisible(chromedp.CSS("#device")))
	b.poll(10*time.Second, "the probe's page, alone", `document.getElementById('dev-h').textContent === '`+probe+`' &&
		getComputedStyle(document.getElementById('overview')).display === 'none' &&
		document.querySelector('#dev-info .badge').textContent === 'offline' &&
		document.querySelector('#dev-sessions tbody td').textContent === 'No live session.' &&
		[...document.querySelectorAll('#dev-events li')].some((li) => li.textContent.includes('offline')) &&
		[...document.querySelectorAll('#dev-events li')].some((li) => li.textContent.includes('online'))`)
	if v := eval[[]string](b, lowContrast); len(v) > 0 {
		t.Errorf("text below WCAG AA contrast on the device's page: %v", v)
	}
	b.do(10*time.Second, "a phone's width", chromedp.EmulateViewport(360, 780), chromedp.Sleep(200*time.Millisecond))
	if w := eval[int](b, `document.documentElement.scrollWidth`); w > 360 {
		t.Errorf("at 360 px the device's page is %d px wide", w)
	}
	b.do(10*time.Second, "a desktop's width", chromedp.EmulateViewport(1280, 900))
	b.checkClean(nil)

	// The policy is in force and the probe sees it: an inline style and an
	// inline script injected now are refused and reported.
	eval[bool](b, `(() => { const d = document.createElement('div'); d.setAttribute('style', 'color: red');
		document.body.append(d); const s = document.createElement('script'); s.textContent = 'window.__inline = 1';
		document.body.append(s); return true; })()`)
	b.poll(5*time.Second, "the injected inline style and script reported", `window.__csp.length >= 2 && window.__inline === undefined`)
}

// screenshots writes docs/screenshots/<name>-desktop.png (1280 px wide)
// and <name>-phone.png (360 px), of the whole page.
func (b *pageBrowser) screenshots(name string) {
	b.t.Helper()
	for _, v := range []struct {
		suffix string
		w, h   int64
	}{{"desktop", 1280, 900}, {"phone", 360, 780}} {
		var shot []byte
		b.do(20*time.Second, "screenshot "+name+" "+v.suffix,
			chromedp.EmulateViewport(v.w, v.h), chromedp.Sleep(300*time.Millisecond),
			chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
				var err error
				shot, err = chromedp.FullScreenshot(100)(ctx, t)
				return err
			}))
		path := filepath.Join("..", "..", "docs", "screenshots", name+"-"+v.suffix+".png")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			b.t.Fatal(err)
		}
		if err := os.WriteFile(path, shot, 0o644); err != nil {
			b.t.Fatal(err)
		}
	}
	b.do(10*time.Second, "reset the viewport", chromedp.EmulateViewport(1280, 900))
}

// The login: the page asks for the token; a wrong one is refused and
// keeps the form; the right one shows the gateway (its canary and the
// expiry of its MQTT certificate too) and sets the cookie
// (HttpOnly, SameSite=Strict), which a reload then uses; a gateway
// that stops and comes back shows a banner, then is live again without a
// reload, also when it lost its state and the stream's position with
// it; logging out asks again. Nothing but the expected 401 answers reaches the console.
func TestPageLoginInBrowser(t *testing.T) {
	const token = "page-token-0123456789abcdef"
	g := newGateway(t, "gw-login", "", fastTiming)
	tokenFile := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(g.config)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := testcert.New(t).Write(t, t.TempDir())
	withToken := strings.NewReplacer(
		fmt.Sprintf("admin: { http: %q }", g.admin), fmt.Sprintf("admin: { http: %q, token_file: %q }", g.admin, tokenFile),
		fmt.Sprintf("mqtt: { tcp: %q }", g.mqttAddr), fmt.Sprintf("mqtt: { tcp: %q, tls: \"127.0.0.1:%d\", cert_file: %q, key_file: %q }", g.mqttAddr, redistest.FreePort(t), certFile, keyFile),
	).Replace(string(cfg)) + "canary: { enabled: true, live: 1m }\n"
	if err := os.WriteFile(g.config, []byte(withToken), 0o600); err != nil {
		t.Fatal(err)
	}
	g.start()

	b := newPageBrowser(t)
	b.do(20*time.Second, "open the page", chromedp.Navigate("http://"+g.admin+"/"), chromedp.WaitVisible(chromedp.CSS("#login")))
	if eval[bool](b, `!document.getElementById('overview').hidden`) {
		t.Fatal("the overview shows before login")
	}
	b.do(10*time.Second, "a wrong token", chromedp.SendKeys(chromedp.CSS("#token"), "not-the-token-0123456789"), chromedp.Click(chromedp.CSS("#login-form button")))
	b.poll(10*time.Second, "the wrong token refused", `document.getElementById('login-error').textContent === 'Wrong token.' && !document.getElementById('login').hidden`)

	b.do(10*time.Second, "the right token", chromedp.SetValue(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#login-form button")))
	b.poll(10*time.Second, "logged in", `!document.getElementById('overview').hidden && document.getElementById('login').hidden &&
		document.getElementById('gw-name').textContent === 'gw-login' && document.getElementById('live').textContent === 'live' &&
		document.getElementById('gateway').textContent.includes('Canarylive, no detection yet') &&
		/Certificate listen\.mqttexpires in 2[34] h/.test(document.getElementById('gateway').textContent)`)
	var cookies []*network.Cookie
	b.do(5*time.Second, "read the cookies", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{})
		cookies = res.Cookies
		return err
	}))
	var found bool
	for _, c := range cookies {
		if c.Name == "fleetgate_admin" {
			found = true
			if !c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict || strings.Contains(c.Value, token) {
				t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, no token inside", c)
			}
		}
	}
	if !found {
		t.Fatalf("no fleetgate_admin cookie among %d", len(cookies))
	}
	if eval[string](b, `document.cookie`) != "" {
		t.Error("the page's script can read the cookie")
	}

	// The gateway stops: the page says the stream is cut; it comes back:
	// the page is live again by itself, the banner gone.
	g.stop()
	b.poll(15*time.Second, "the banner of a cut stream", `!document.getElementById('banner').hidden && document.getElementById('live').textContent === 'cut'`)
	g.start()
	b.poll(20*time.Second, "live again", `document.getElementById('banner').hidden && document.getElementById('live').textContent === 'live'`)
	// It comes back with its state lost (a new store incarnation): the
	// stream's position (the event of a device) is refused (410); the
	// page starts again from now.
	device{t: t, id: "login-dev-1"}.heartbeat(g.coapAddr)
	b.poll(10*time.Second, "the device's event in the feed", `document.getElementById('feed').textContent.includes('login-dev-1')`)
	g.stop()
	if err := os.RemoveAll(filepath.Join(filepath.Dir(g.config), "state")); err != nil {
		t.Fatal(err)
	}
	b.poll(15*time.Second, "the banner of a cut stream, again", `!document.getElementById('banner').hidden`)
	g.start()
	b.poll(30*time.Second, "live again from now", `document.getElementById('banner').hidden && document.getElementById('live').textContent === 'live'`)
	b.mu.Lock()
	statuses := fmt.Sprint(b.watch)
	b.mu.Unlock()
	if !strings.Contains(statuses, "410 200]") {
		t.Errorf("/v1/watch answered %s: want the lost position's 410, then a stream from now", statuses)
	}

	b.do(10*time.Second, "reload", chromedp.Reload())
	b.poll(10*time.Second, "still logged in after a reload", `!document.getElementById('overview').hidden && document.getElementById('gw-name').textContent === 'gw-login'`)
	b.do(10*time.Second, "log out", chromedp.Click(chromedp.CSS("#logout")))
	b.poll(10*time.Second, "the login form again", `!document.getElementById('login').hidden && document.getElementById('overview').hidden`)

	// The browser logs each 401 the page met (the status before the
	// login, the wrong token, the status after the logout), each
	// request to the stopped gateway and the 410 of the lost position as
	// a failed resource load; nothing else.
	b.checkClean(func(m chromedp.ConsoleMessage) bool {
		return m.Source == "network" && (strings.Contains(m.Text, "401") || strings.Contains(m.Text, "410") || strings.Contains(m.Text, "ERR_CONNECTION_REFUSED"))
	})
}

func TestPageOwnRequest(t *testing.T) {
	for raw, want := range map[string]bool{
		"http://127.0.0.1:8080/":                     true,
		"http://127.0.0.1:8080/ui/app.js":            true,
		"http://127.0.0.1:8080/v1/devices?order=id":  true,
		"http://127.0.0.1:8080/login":                true,
		"http://127.0.0.1:8080/favicon.ico":          false,
		"http://127.0.0.1:8080/debug/pprof/":         false,
		"https://cdn.example.com/v1/lib.js":          false,
		"data:text/plain,x":                          false,
		"http://127.0.0.1:8080/metrics":              false,
		"http://127.0.0.1:8080/v1ui/../ui/style.css": false,
	} {
		if got := pageOwnRequest(raw); got != want {
			t.Errorf("pageOwnRequest(%q) = %v, want %v", raw, got, want)
		}
	}
}
