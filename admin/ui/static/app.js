// fleetgate's page: reads the public /v1 API of the admin listener
// (docs/openapi.yaml) and nothing else. No framework, no build step.
'use strict';

(() => {
  const PAGE = 50; // devices a table page asks for
  const FEED = 50; // events the live feed keeps
  const SPARK_MINUTES = 30;
  const STATUS_EVERY = 5000;
  const TABLE_EVERY = 15000;

  const $ = (id) => document.getElementById(id);

  // el builds an element; text is set as text, never parsed as HTML.
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'text') e.textContent = v;
      else if (k === 'class') e.className = v;
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const k of kids) e.append(k);
    return e;
  }

  const ui = {
    authed: false,
    skew: 0, // server clock minus this browser's, in ms (from Date headers)
    status: null,
    cursors: [''], // cursor of each table page visited, of the table's query
    next: '',
    rows: [], // the devices of the table page, as the API gave them
    search: '', // the ID prefix searched, while its result is shown
    gateways: [], // /v1/gateways, each with contact moved to this browser's clock
    bannerKind: '', // 'cut', 'resync' or 'error' while the banner shows
    bannerSeq: 0, // counts the banners shown
    feed: [],
    spark: new Map(), // minute → {on, off}
    es: null,
    lastCursor: '',
    device: null, // the device page's ID
    deviceEvents: [],
    timers: [],
  };

  class AuthError extends Error {}

  async function api(path, opts) {
    const r = await fetch(path, Object.assign({ credentials: 'same-origin', headers: { Accept: 'application/json' } }, opts));
    const date = Date.parse(r.headers.get('Date') || '');
    if (!Number.isNaN(date)) ui.skew = date + 500 - Date.now(); // Date has whole seconds
    if (r.status === 401 && path !== '/login') throw new AuthError('login needed');
    const body = await r.json().catch(() => ({}));
    if (!r.ok) {
      const e = new Error(body.error || ('HTTP ' + r.status));
      e.status = r.status;
      e.body = body;
      throw e;
    }
    return body;
  }

  const now = () => Date.now() + ui.skew;

  // --- formatting ---
  function fmtDur(ms) {
    if (!Number.isFinite(ms)) return '';
    const neg = ms < 0;
    let s = Math.round(Math.abs(ms) / 1000);
    let out;
    if (s < 60) out = s + ' s';
    else if (s < 3600) out = Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
    else if (s < 86400) out = Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
    else out = Math.floor(s / 86400) + ' d ' + Math.floor((s % 86400) / 3600) + ' h';
    return neg ? '-' + out : out;
  }
  const fmtNs = (ns) => (ns ? fmtDur(ns / 1e6) : '0 s');
  function ago(t) {
    const ms = now() - Date.parse(t);
    return Number.isFinite(ms) ? fmtDur(ms) + ' ago' : '';
  }
  function until(t) {
    const ms = Date.parse(t) - now();
    if (!Number.isFinite(ms)) return '';
    return ms >= 0 ? 'in ' + fmtDur(ms) : fmtDur(-ms) + ' ago';
  }
  // A <time> whose text the ticker keeps current: kind "ago" or "until".
  function timeEl(t, kind) {
    if (!t || t.startsWith('0001-')) return document.createTextNode('–');
    return el('time', { datetime: t, title: t, 'data-rel': kind, text: kind === 'ago' ? ago(t) : until(t) });
  }
  function tick() {
    for (const e of document.querySelectorAll('time[data-rel]')) {
      const t = e.getAttribute('datetime');
      e.textContent = e.dataset.rel === 'ago' ? ago(t) : until(t);
    }
    if (ui.status) $('uptime').textContent = fmtDur(now() - Date.parse(ui.status.started_at));
  }

  // protocolOf names the protocol of a session ID (docs/design.md §1):
  // coap/<instance>, <adapter>/<instance>, <gateway>/<epoch>/<n> and
  // <gateway>/mqtt (MQTT).
  function protocolOf(session) {
    if (!session) return '';
    const p = session.split('/');
    if (p.length === 3 || p[1] === 'mqtt') return 'mqtt';
    return p[0];
  }
  const badge = (state) => el('span', { class: 'badge ' + state, text: state });

  // --- views ---
  function show(view) {
    for (const id of ['login', 'overview', 'device', 'notfound']) $(id).hidden = id !== view;
  }

  function route() {
    const m = location.hash.match(/^#\/device\/(.+)$/);
    if (m) openDevice(decodeURIComponent(m[1]));
    else {
      ui.device = null;
      show('overview');
    }
    $('main').focus();
  }

  // --- login ---
  async function login(ev) {
    ev.preventDefault();
    const input = $('token');
    $('login-error').textContent = '';
    try {
      const r = await fetch('/login', {
        method: 'POST', credentials: 'same-origin',
        headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ token: input.value }),
      });
      if (r.status === 401) {
        $('login-error').textContent = 'Wrong token.';
        input.select();
        return;
      }
      if (!r.ok) throw new Error('HTTP ' + r.status);
      input.value = '';
      start();
    } catch (e) {
      $('login-error').textContent = 'Login failed: ' + e.message;
    }
  }

  // logout clears the cookie; without a token configured the page then
  // simply starts again.
  async function logout() {
    stop();
    await fetch('/logout', { method: 'POST', credentials: 'same-origin' });
    start();
  }

  function needLogin() {
    stop();
    ui.authed = false;
    $('logout').hidden = true;
    setLive('logged out', 'cut');
    show('login');
    $('token').focus();
  }

  // --- status ---
  async function loadStatus() {
    const st = await api('/v1/status');
    ui.status = st;
    if (ui.bannerKind === 'error') banner('');
    renderStatus(st);
  }

  function fact(dl, term, value) {
    dl.append(el('dt', { text: term }), el('dd', {}, value instanceof Node ? value : document.createTextNode(value)));
  }

  function renderStatus(st) {
    $('gw-name').textContent = st.gateway;
    document.title = 'fleetgate · ' + st.gateway;
    const g = $('gateway');
    g.replaceChildren();
    fact(g, 'Version', st.version);
    fact(g, 'Uptime', el('span', { id: 'uptime', text: fmtDur(now() - Date.parse(st.started_at)) }));
    fact(g, 'Store', st.store + ', ' + st.shards + ' shards');
    fact(g, 'Sessions here', String(st.sessions));
    const up = st.uplink;
    if (up) {
      const down = (up.shards_down || []).map((d) => d.shard);
      fact(g, 'Store reachable', up.up ? 'yes' : 'no' + (down.length ? ' (shards ' + down.join(', ') + ' down)' : '') + (up.last_error ? ': ' + up.last_error : ''));
      fact(g, 'Outbox', up.outbox_sessions + ' sessions' + (up.outbox_sessions ? ', oldest ' + fmtNs(up.outbox_oldest_age_ns) : ''));
    }
    const rn = st.runner;
    if (rn) fact(g, 'Runner', (rn.shards || []).length + ' of ' + st.shards + ' shards, lag ' + fmtNs(rn.last_lag_ns) + ', ' + rn.reaped + ' reaped');
    else fact(g, 'Runner', 'off');
    if (st.publisher) fact(g, 'Publisher', (st.publisher.connected ? 'connected' : 'not connected') + ', ' + st.publisher.published + ' published');
    if (st.bridge && st.bridge.upstream) fact(g, 'Bridge', (st.bridge.upstream.connected ? 'connected' : 'not connected') + ', ' + st.bridge.upstream.forwarded + ' forwarded');
    const cn = st.canary;
    if (cn) {
      const log = (cn.paths || {}).log;
      fact(g, 'Canary', cn.phase + (log && log.detected ? ', last detection ' + fmtNs(log.last_detection_ns) + ' (bound ' + fmtNs(cn.bound_ns) + ')' : ', no detection yet') +
        (cn.false_offline ? ', ' + cn.false_offline + ' false offline' : ''));
    }
    for (const c of st.certificates || []) {
      const left = Date.parse(c.not_after) - now();
      fact(g, 'Certificate ' + c.key, (left > 0 ? 'expires in ' + fmtDur(left) : 'EXPIRED ' + fmtDur(-left) + ' ago') + ' (' + c.not_after.slice(0, 10) + ')');
    }
    const ads = st.adapters || [];
    if (ads.length) fact(g, 'Adapters', ads.map((a) => a.name + ' ' + a.state).join(', '));

    const b = $('bounds');
    b.replaceChildren();
    for (const [k, v] of Object.entries(st.bounds || {})) fact(b, k.replaceAll('_', ' '), String(v));

    $('adapters-none').hidden = ads.length > 0;
    $('adapters').hidden = ads.length === 0;
    $('adapters').tBodies[0].replaceChildren(...ads.map((a) => el('tr', {},
      el('td', { text: a.name }), el('td', { text: a.state }), el('td', { text: String(a.restarts) }),
      el('td', { text: String(a.sessions) }), el('td', { text: a.last_error || '' }))));
    const sel = $('f-proto');
    for (const a of ads) {
      if (![...sel.options].some((o) => o.value === a.name)) sel.append(el('option', { value: a.name, text: a.name }));
    }

    // Parts this page does not know by name (a newer gateway's) are shown as they are.
    const known = new Set(['gateway', 'epoch', 'version', 'started_at', 'store', 'shards', 'sessions', 'uplink', 'runner', 'publisher', 'bridge', 'adapters', 'bounds', 'fleet', 'canary', 'certificates']);
    const extra = $('extra');
    extra.replaceChildren();
    for (const [k, v] of Object.entries(st)) {
      if (known.has(k)) continue;
      extra.append(el('h3', { text: k.replaceAll('_', ' ') }), el('pre', { text: JSON.stringify(v, null, 2) }));
    }
    renderCounts();
  }

  // The fleet's counts come from /v1/status ("fleet": the store's counts
  // by stored state, and the suspect devices among the online, which the
  // online box leaves out); without them the page counts the table page
  // it shows, and says so: it never reads the whole fleet to count it.
  function renderCounts() {
    const f = ui.status && ui.status.fleet;
    const set = (id, n) => { $(id).textContent = n === undefined ? '–' : Number(n).toLocaleString('en'); };
    if (f && !f.error && typeof f.online === 'number') {
      const sus = typeof f.suspect === 'number' ? f.suspect : undefined;
      set('n-online', sus === undefined ? f.online : f.online - sus);
      set('n-suspect', sus);
      set('n-offline', f.offline);
      $('counts-note').textContent = sus === undefined
        ? 'Whole fleet, from the store (suspect devices are counted as online).'
        : 'Whole fleet, from the store. Suspect: no evidence for presence.suspect_after, the lease still running. Online includes the devices whose lease ran out that the runner has not reaped yet.';
      return;
    }
    const n = { online: 0, suspect: 0, offline: 0 };
    for (const d of ui.rows) n[d.state] = (n[d.state] || 0) + 1;
    set('n-online', n.online);
    set('n-suspect', n.suspect);
    set('n-offline', n.offline);
    $('counts-note').textContent = 'Of the ' + ui.rows.length + ' devices of the page below' +
      (f && f.error ? ' (the store did not count the fleet: ' + f.error + ').' : ' (this store keeps no fleet-wide counts).');
  }

  // --- the device table ---
  // The store searches and sorts (GET /v1/devices: order, prefix, state,
  // protocol); the page shows one page of its answer at a time.
  const byChange = () => !ui.search && $('f-order').value === 'changed';

  function tableQuery() {
    const p = new URLSearchParams({ limit: String(PAGE) });
    if (ui.search) p.set('prefix', ui.search);
    p.set('order', ui.search ? 'id' : $('f-order').value);
    const st = $('f-state').value;
    if (st) p.set('state', st);
    const proto = $('f-proto').value;
    if (proto) p.set('protocol', proto);
    return p;
  }

  async function loadTable() {
    const p = tableQuery();
    const cursor = ui.cursors[ui.cursors.length - 1];
    if (cursor) p.set('cursor', cursor);
    let page;
    try {
      page = await api('/v1/devices?' + p);
    } catch (e) {
      if (e.status !== 400 || !ui.search) throw e;
      ui.rows = [];
      ui.next = '';
      renderTable('“' + ui.search + '” is not the start of a device ID (' + e.message + ').');
      return;
    }
    ui.rows = page.devices;
    ui.next = page.next;
    renderTable();
  }

  function deviceRow(d) {
    const link = el('a', { href: '#/device/' + encodeURIComponent(d.device), text: d.device });
    return el('tr', { 'data-device': d.device },
      el('td', { class: 'id' }, link), el('td', {}, badge(d.state)), el('td', {}, timeEl(d.since, 'ago')),
      el('td', { text: protocolOf(d.session) }), el('td', { text: d.gw || '' }),
      el('td', {}, d.state === 'offline' ? document.createTextNode('–') : timeEl(d.deadline, 'until')));
  }

  // renderTable shows the page of devices; by last change, a device that
  // changed since the page was read moves up within it.
  function renderTable(problem) {
    const rows = ui.rows.slice();
    if (byChange()) rows.sort((a, b) => Date.parse(b.since) - Date.parse(a.since) || (a.device < b.device ? 1 : -1));
    $('devices').tBodies[0].replaceChildren(...rows.map(deviceRow));
    if (!rows.length) {
      $('devices').tBodies[0].append(el('tr', {}, el('td', { colspan: 6, text: ui.next ? 'No device of this page passes the filters; the next pages may hold some.' : 'No device here.' })));
    }
    const n = ui.cursors.length;
    const how = ui.search ? 'matching “' + ui.search + '”, by device ID' : byChange() ? 'by last change, newest first' : 'by device ID';
    $('dev-caption').textContent = problem || 'Page ' + n + ': ' + rows.length + (rows.length === 1 ? ' device ' : ' devices ') + how + (ui.next ? '; more on the next page' : '');
    $('th-changed').setAttribute('aria-sort', byChange() ? 'descending' : 'none');
    $('th-device').setAttribute('aria-sort', byChange() ? 'none' : 'ascending');
    $('page-info').textContent = 'Page ' + n;
    $('prev').disabled = n === 1;
    $('next').disabled = !ui.next;
    renderCounts();
  }

  // search shows the devices whose ID starts with the text (all when it
  // is empty), by ID, read by the store a page at a time.
  async function search(ev) {
    if (ev) ev.preventDefault();
    ui.search = $('q').value.trim();
    ui.cursors = [''];
    await loadTable();
  }

  // --- gateways ---
  const gwState = (g) => (g.lost ? 'lost' : g.behind ? 'behind' : 'heard');

  async function loadGateways() {
    const l = await api('/v1/gateways');
    // contacts are on the store's clock: moved onto this browser's
    const shift = now() - Date.parse(l.now);
    ui.gateways = l.gateways.map((g) => Object.assign({}, g, { contact: Number.isNaN(shift) ? g.contact : new Date(Date.parse(g.contact) + shift).toISOString() }));
    renderGateways();
  }

  function renderGateways() {
    $('gateways').tBodies[0].replaceChildren(...ui.gateways.map((g) => el('tr', { 'data-gateway': g.id },
      el('td', { class: 'id', text: g.id }), el('td', {}, el('span', { class: 'badge ' + gwState(g), text: gwState(g) })),
      el('td', { class: 'n', text: Number(g.sessions || 0).toLocaleString('en') }), el('td', {}, timeEl(g.contact, 'ago')))));
    if (!ui.gateways.length) $('gateways').tBodies[0].append(el('tr', {}, el('td', { colspan: 4, text: 'No gateway has written to the store yet.' })));
    const lost = ui.gateways.filter((g) => g.lost).length;
    $('gws-caption').textContent = ui.gateways.length + (ui.gateways.length === 1 ? ' gateway' : ' gateways') + ' the store has heard, ' + lost + ' lost; sessions: the live sessions the store holds of each';
  }

  // A gateway event (lost or back) changes its row at once, then the
  // list is read again for its contact and sessions.
  function onGatewayEvent(ev) {
    const g = ui.gateways.find((x) => x.id === ev.gateway);
    if (g) {
      g.lost = ev.state === 'lost';
      renderGateways();
      const tr = $('gateways').querySelector('tr[data-gateway="' + CSS.escape(ev.gateway) + '"]');
      if (tr) tr.classList.add('changed');
    }
    loadGateways().catch(report);
  }

  // --- live events ---
  function setLive(text, cls) {
    const l = $('live');
    l.textContent = text;
    l.className = 'pill ' + (cls || '');
  }
  // banner shows text (kind 'cut', 'resync' or 'error'; none: hides it)
  // and returns its number. A stream that opens again hides a 'cut' or
  // 'error' banner; a 'resync' one stays for 30 s.
  function banner(text, kind) {
    $('banner').textContent = text || '';
    $('banner').hidden = !text;
    ui.bannerKind = text ? kind : '';
    return ++ui.bannerSeq;
  }

  function watch() {
    if (ui.es) ui.es.close();
    const url = '/v1/watch' + (ui.lastCursor ? '?cursor=' + encodeURIComponent(ui.lastCursor) : '');
    const es = new EventSource(url);
    ui.es = es;
    es.onopen = () => {
      setLive('live', 'live');
      if (ui.bannerKind === 'cut' || ui.bannerKind === 'error') banner('');
    };
    es.addEventListener('presence', (m) => {
      ui.lastCursor = m.lastEventId || ui.lastCursor;
      onEvent(JSON.parse(m.data));
    });
    es.addEventListener('gateway', (m) => {
      ui.lastCursor = m.lastEventId || ui.lastCursor;
      const ev = JSON.parse(m.data);
      onGatewayEvent(ev);
      ui.feed.unshift(ev);
      ui.feed.length = Math.min(ui.feed.length, FEED);
      $('feed').prepend(gatewayItem(ev));
      $('feed-empty').hidden = true;
    });
    es.addEventListener('resync', (m) => {
      // The position is lost (a trimmed log, a new incarnation): watch
      // from now, and read again what the events would have changed.
      es.close();
      ui.lastCursor = '';
      let why = '';
      try {
        why = JSON.parse(m.data).reason || '';
      } catch (e) {
        why = '';
      }
      const shown = banner('The event stream was resynced' + (why ? ' (' + why + ')' : '') + ' at ' + new Date(now()).toLocaleTimeString('en-GB') +
        ': events were missed, so the counts, the devices and the gateways were read again.', 'resync');
      ui.timers.push(setTimeout(() => { if (ui.bannerSeq === shown) banner(''); }, 30000));
      watch();
      refresh();
    });
    es.onerror = () => {
      setLive('cut', 'cut');
      if (es.readyState === EventSource.CLOSED) {
        banner('The event stream was cut; trying again in 5 s.', 'cut');
        ui.timers.push(setTimeout(() => { ui.lastCursor = ''; refresh(); watch(); }, 5000));
      } else {
        banner('The event stream was cut; reconnecting.', 'cut');
      }
    };
  }

  function onEvent(ev) {
    ui.feed.unshift(ev);
    ui.feed.length = Math.min(ui.feed.length, FEED);
    $('feed').prepend(feedItem(ev, true));
    while ($('feed').children.length > FEED) $('feed').lastChild.remove();
    $('feed-empty').hidden = true;

    const minute = Math.floor(Date.parse(ev.at) / 60000);
    const m = ui.spark.get(minute) || { on: 0, off: 0 };
    if (ev.state === 'online') m.on++;
    else m.off++;
    ui.spark.set(minute, m);
    renderSpark();

    const row = ui.rows.find((d) => d.device === ev.device);
    if (row && ev.ver > row.ver) {
      Object.assign(row, { state: ev.state, store_state: ev.state, since: ev.at, ver: ev.ver, gw: ev.gateway, session: ev.session });
      if (ev.state === 'offline') row.deadline = '';
      renderTable();
      const tr = $('devices').querySelector('tr[data-device="' + CSS.escape(ev.device) + '"]');
      if (tr) tr.classList.add('changed');
    }
    if (ui.device === ev.device) {
      ui.deviceEvents.unshift(ev);
      $('dev-events').prepend(feedItem(ev, false));
      loadDevice().catch(report);
    }
  }

  function gatewayItem(ev) {
    return el('li', {},
      el('span', { class: 'when' }, el('time', { datetime: ev.at, title: ev.at, text: new Date(ev.at).toLocaleTimeString('en-GB') })),
      el('span', { text: 'gateway ' + ev.gateway }), el('span', { class: 'badge ' + (ev.state === 'lost' ? 'lost' : 'heard'), text: ev.state }));
  }

  function feedItem(ev, withDevice) {
    return el('li', {},
      el('span', { class: 'when' }, el('time', { datetime: ev.at, title: ev.at, text: new Date(ev.at).toLocaleTimeString('en-GB') })),
      withDevice ? el('a', { href: '#/device/' + encodeURIComponent(ev.device), text: ev.device }) : '',
      badge(ev.state), el('span', { text: ev.reason + (ev.gateway ? ' via ' + ev.gateway : '') }));
  }

  function renderSpark() {
    const svg = $('spark');
    const ns = 'http://www.w3.org/2000/svg';
    const last = Math.floor(now() / 60000);
    let max = 1;
    for (const [k, v] of ui.spark) {
      if (k <= last - SPARK_MINUTES) ui.spark.delete(k);
      else max = Math.max(max, v.on, v.off);
    }
    const w = 300 / SPARK_MINUTES;
    const bars = [];
    for (let i = 0; i < SPARK_MINUTES; i++) {
      const v = ui.spark.get(last - SPARK_MINUTES + 1 + i);
      if (!v) continue;
      for (const [n, cls, x] of [[v.on, 'bar-on', i * w], [v.off, 'bar-off', i * w + w / 2]]) {
        if (!n) continue;
        const h = Math.max(2, (n / max) * 46);
        const r = document.createElementNS(ns, 'rect');
        r.setAttribute('x', x.toFixed(1));
        r.setAttribute('y', (48 - h).toFixed(1));
        r.setAttribute('width', (w / 2 - 0.5).toFixed(1));
        r.setAttribute('height', h.toFixed(1));
        r.setAttribute('class', cls);
        bars.push(r);
      }
    }
    svg.replaceChildren(...bars);
    const cur = ui.spark.get(last) || { on: 0, off: 0 };
    $('spark-cap').textContent = 'Online (green) and offline (red) events per minute over the last ' + SPARK_MINUTES + ' minutes since this page opened; this minute: ' + cur.on + ' online, ' + cur.off + ' offline.';
  }

  // --- a device's page ---
  async function openDevice(id) {
    ui.device = id;
    ui.deviceEvents = [];
    $('dev-h').textContent = id;
    $('dev-events').replaceChildren();
    try {
      await loadDevice();
    } catch (e) {
      if (e instanceof AuthError) return needLogin();
      show('notfound');
      $('notfound-msg').textContent = e.status === 404 ? 'The store has never seen a device called “' + id + '”.' : e.message;
      const r = e.body && e.body.last_refusal;
      if (r) $('notfound-msg').textContent += ' Its last refusal: ' + r.reason + (r.detail ? ' (' + r.detail + ')' : '') + ', ' + ago(r.at) + '.';
      return;
    }
    show('device');
    loadDeviceEvents(id).catch(report);
  }

  async function loadDevice() {
    const id = ui.device;
    const d = await api('/v1/devices/' + encodeURIComponent(id));
    if (ui.device !== id) return;
    const info = $('dev-info');
    info.replaceChildren();
    fact(info, 'State', badge(d.state));
    fact(info, 'Since', timeEl(d.since, 'ago'));
    fact(info, 'Deadline', d.deadline ? timeEl(d.deadline, 'until') : '–');
    fact(info, 'Last written by', (d.gw || '–') + (d.session ? ', session ' + d.session : ''));
    fact(info, 'Version', String(d.ver));
    const local = d.local_sessions || [];
    const lastSeen = local.map((s) => s.LastSeen).sort().pop();
    fact(info, 'Last evidence here', lastSeen ? timeEl(lastSeen, 'ago') : '–');
    $('dev-sessions').tBodies[0].replaceChildren(...(d.sessions || []).map((s) => el('tr', {},
      el('td', { class: 'id', text: s.id }), el('td', { text: protocolOf(s.id) }), el('td', { text: s.gw }), el('td', {}, timeEl(s.deadline, 'until')))));
    if (!(d.sessions || []).length) $('dev-sessions').tBodies[0].append(el('tr', {}, el('td', { colspan: 4, text: 'No live session.' })));
    $('dev-local').tBodies[0].replaceChildren(...local.map((s) => el('tr', {},
      el('td', { class: 'id', text: s.Session }), el('td', { text: s.Protocol }), el('td', {}, timeEl(s.FirstSeen, 'ago')),
      el('td', {}, timeEl(s.LastSeen, 'ago')), el('td', {}, timeEl(s.Deadline, 'until')))));
    if (!local.length) $('dev-local').tBodies[0].append(el('tr', {}, el('td', { colspan: 5, text: 'None on this gateway.' })));
    const r = d.last_refusal;
    $('dev-refusal').textContent = r ? r.protocol + ': ' + r.reason + (r.detail ? ' (' + r.detail + ')' : '') + (r.remote ? ' from ' + r.remote : '') + ', ' + ago(r.at) : 'None kept.';
  }

  async function loadDeviceEvents(id) {
    let url = '/v1/events?since=5m&limit=1000';
    const found = [];
    for (let i = 0; i < 5; i++) {
      const page = await api(url);
      for (const ev of page.events) if (ev.device === id) found.push(Object.assign({ gateway: ev.gw }, ev));
      if (page.events.length < 1000) break;
      url = '/v1/events?limit=1000&cursor=' + encodeURIComponent(page.cursor);
    }
    if (ui.device !== id) return;
    const live = new Set(ui.deviceEvents.map((e) => e.ver));
    for (const ev of found.reverse()) if (!live.has(ev.ver)) $('dev-events').append(feedItem(ev, false));
    if (!$('dev-events').children.length) $('dev-events').append(el('li', { text: 'No event in the last 5 minutes.' }));
  }

  // --- lifecycle ---
  function report(e) {
    if (e instanceof AuthError) return needLogin();
    banner('The gateway did not answer: ' + e.message, 'error');
  }

  async function refresh() {
    try {
      await Promise.all([loadStatus(), loadTable(), loadGateways()]);
    } catch (e) {
      report(e);
    }
  }

  function stop() {
    if (ui.es) ui.es.close();
    ui.es = null;
    for (const t of ui.timers) clearTimeout(t), clearInterval(t);
    ui.timers = [];
  }

  async function start() {
    stop();
    try {
      await loadStatus();
    } catch (e) {
      if (e instanceof AuthError) return needLogin();
      banner('The gateway did not answer: ' + e.message, 'error');
      ui.timers.push(setTimeout(start, 5000));
      return;
    }
    ui.authed = true;
    $('logout').hidden = false;
    banner('');
    route();
    watch();
    loadTable().catch(report);
    loadGateways().catch(report);
    renderSpark();
    ui.timers.push(setInterval(() => Promise.all([loadStatus(), loadGateways()]).catch(report), STATUS_EVERY));
    ui.timers.push(setInterval(() => loadTable().catch(report), TABLE_EVERY));
    ui.timers.push(setInterval(() => { if (ui.device) loadDevice().catch(report); }, STATUS_EVERY));
    ui.timers.push(setInterval(tick, 1000));
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('login-form').addEventListener('submit', login);
    $('logout').addEventListener('click', () => logout().catch(report));
    $('filters').addEventListener('submit', (e) => search(e).catch(report));
    for (const id of ['f-state', 'f-proto', 'f-order']) {
      $(id).addEventListener('change', () => { ui.cursors = ['']; loadTable().catch(report); });
    }
    $('prev').addEventListener('click', () => { if (ui.cursors.length > 1) ui.cursors.pop(); loadTable().catch(report); });
    $('next').addEventListener('click', () => { if (ui.next) ui.cursors.push(ui.next); loadTable().catch(report); });
    window.addEventListener('hashchange', () => { if (ui.authed) route(); });
    start();
  });
})();
