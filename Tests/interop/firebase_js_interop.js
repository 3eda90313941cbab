// The unmodified Firebase JavaScript SDK (vendored in firebase-js-11/) against a Banyan cluster
// over the WebSocket protocol v5, as apps point it at the Firebase emulator. Run by .ci/run:
//   node Tests/interop/firebase_js_interop.js 127.0.0.1:19500 127.0.0.1:19501 127.0.0.1:19502
// Each check runs with its own deadline; the exit status is the number of failed checks.
'use strict';
const net = require('net');
const path = require('path');
const { createRequire } = require('module');
const req = createRequire(path.join(__dirname, 'firebase-js-11') + '/');
const { initializeApp, deleteApp } = req('firebase/app');
const fdb = req('firebase/database');
const {
  getDatabase, connectDatabaseEmulator, ref, set, update, push, get, remove, onValue, onChildAdded, off,
  runTransaction, query, orderByChild, orderByKey, orderByPriority, limitToLast, limitToFirst, startAt, endAt,
  onDisconnect, goOffline, goOnline, serverTimestamp, increment, setWithPriority, enableLogging,
} = fdb;

const nodes = process.argv.slice(2);
if (nodes.length === 0) {
  console.error('usage: node firebase_js_interop.js host:port [host:port ...]');
  process.exit(64);
}
if (process.env.LOG) enableLogging(true);
const ns = 'jsinterop' + Date.now().toString(36);
let appCount = 0;
const apps = [];

function connect(nodeIndex) {
  const [host, port] = nodes[nodeIndex % nodes.length].split(':');
  const app = initializeApp({ projectId: 'demo', databaseURL: `http://${host}:${port}?ns=${ns}` }, `app${appCount++}`);
  const db = getDatabase(app);
  connectDatabaseEmulator(db, host, Number(port));
  apps.push(app);
  return db;
}

function deadline(ms, what) {
  let timer;
  const p = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), ms); });
  return { p, cancel: () => clearTimeout(timer) };
}

// Resolves with the first value of `q` for which `pred` holds.
function waitFor(q, pred, ms, what) {
  return new Promise((resolve, reject) => {
    let last;
    let done = false;
    let unsub = null;
    const finish = () => { done = true; clearTimeout(timer); if (unsub) unsub(); };
    const timer = setTimeout(() => { finish(); reject(new Error(`timed out waiting for ${what}; last value ${short(last)}`)); }, ms);
    // The first callback can come synchronously (a cached value), before `unsub` is known.
    unsub = onValue(q, (snap) => {
      last = snap.val();
      if (!done && pred(last, snap)) { finish(); resolve(snap); }
    }, (err) => { finish(); reject(err); });
    if (done) unsub();
  });
}

function short(v) {
  const t = JSON.stringify(v) || String(v);
  return t.length > 200 ? `${t.slice(0, 200)}… (${t.length} characters)` : t;
}

function assertEqual(actual, expected, what) {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) throw new Error(`${what}: expected ${short(expected)}, got ${short(actual)}`);
}

async function rest(nodeIndex, p) {
  const res = await fetch(`http://${nodes[nodeIndex % nodes.length]}/${p}.json?ns=${ns}`);
  return res.json();
}

const checks = [];
function check(name, fn) { checks.push({ name, fn }); }

const db0 = connect(0);
const db1 = connect(1);
const db2 = connect(2);

check('connects: .info/connected and the hello\'s server time', async () => {
  await waitFor(ref(db0, '.info/connected'), (v) => v === true, 10000, 'connected');
  const offset = await waitFor(ref(db0, '.info/serverTimeOffset'), (v) => typeof v === 'number', 10000, 'serverTimeOffset');
  if (Math.abs(offset.val()) > 10000) throw new Error(`server time offset ${offset.val()} ms`);
});

check('set, multi-path update, listen: every value event in order', async () => {
  const r = ref(db0, 'rooms/r1');
  const seen = [];
  const unsub = onValue(r, (s) => seen.push(s.val()));
  await set(r, { title: 'Hi', n: 1 });
  await update(r, { n: 2, 'meta/at': 5 });
  await update(ref(db0), { 'rooms/r1/n': 3, 'rooms/r2': { title: 'two' } });
  unsub();
  assertEqual(seen[seen.length - 1], { meta: { at: 5 }, n: 3, title: 'Hi' }, 'last value');
  assertEqual(await rest(1, 'rooms'), { r1: { meta: { at: 5 }, n: 3, title: 'Hi' }, r2: { title: 'two' } }, 'REST read on another node');
});

check('a listen on one node sees pushes made on another, in order', async () => {
  const keys = [];
  const got = new Promise((resolve) => {
    const unsub = onChildAdded(ref(db1, 'chat'), (s) => { keys.push([s.key, s.val().i]); if (keys.length === 5) { unsub(); resolve(); } });
  });
  const pushed = [];
  for (let i = 0; i < 5; i++) pushed.push((await push(ref(db0, 'chat'), { i })).key);
  const d = deadline(10000, 'five child_added events');
  await Promise.race([got, d.p]);
  d.cancel();
  assertEqual(keys.map((k) => k[0]), pushed, 'keys in push order');
  assertEqual(keys.map((k) => k[1]), [0, 1, 2, 3, 4], 'values');
});

check('get on a third node after an acknowledged write (read-your-writes across nodes)', async () => {
  for (let i = 0; i < 10; i++) {
    await set(ref(db0, 'ryw'), i);
    const s = await get(ref(db2, 'ryw'));
    assertEqual(s.val(), i, `get after write ${i}`);
  }
});

check('ordered, limited query windows (orderByChild + limitToLast, limitToFirst on keys)', async () => {
  const scores = {};
  for (let i = 0; i < 10; i++) scores[`p${i}`] = { score: i * 10 };
  await set(ref(db0, 'scores'), scores);
  const top = query(ref(db1, 'scores'), orderByChild('score'), limitToLast(3));
  let snap = await waitFor(top, (v) => v && Object.keys(v).length === 3, 10000, 'top 3');
  const order = [];
  snap.forEach((c) => { order.push(c.key); });
  assertEqual(order, ['p7', 'p8', 'p9'], 'top three in order');
  await update(ref(db0, 'scores/p0'), { score: 1000 });
  snap = await waitFor(top, (v) => v && v.p0, 10000, 'p0 enters the window');
  const order2 = [];
  snap.forEach((c) => { order2.push(c.key); });
  assertEqual(order2, ['p8', 'p9', 'p0'], 'window after p0 rose');
  const first = await get(query(ref(db2, 'scores'), orderByKey(), limitToFirst(2)));
  assertEqual(Object.keys(first.val()), ['p0', 'p1'], 'get with a query');
  const range = await get(query(ref(db2, 'scores'), orderByChild('score'), startAt(20), endAt(40)));
  assertEqual(Object.keys(range.val()).sort(), ['p2', 'p3', 'p4'], 'range query');
});

check('transactions from clients on all three nodes end at the exact total', async () => {
  await set(ref(db0, 'counter'), 0);
  const perClient = 15;
  const runs = [db0, db1, db2].map(async (db) => {
    for (let i = 0; i < perClient; i++) {
      const r = await runTransaction(ref(db, 'counter'), (v) => (v || 0) + 1);
      if (!r.committed) throw new Error('a transaction did not commit');
    }
  });
  await Promise.all(runs);
  const total = await rest(0, 'counter');
  assertEqual(total, 3 * perClient, 'counter');
});

check('server values: timestamp and increment', async () => {
  const before = Date.now();
  await set(ref(db0, 'sv'), { at: serverTimestamp(), n: 5 });
  await update(ref(db1, 'sv'), { n: increment(2) });
  const v = (await get(ref(db2, 'sv'))).val();
  if (typeof v.at !== 'number' || Math.abs(v.at - before) > 60000) throw new Error(`timestamp ${v.at}`);
  assertEqual(v.n, 7, 'incremented');
});

check('priorities: setWithPriority and orderByPriority', async () => {
  await setWithPriority(ref(db0, 'prio/a'), 'A', 3);
  await setWithPriority(ref(db0, 'prio/b'), 'B', 1);
  await setWithPriority(ref(db0, 'prio/c'), 'C', 2);
  const s = await get(query(ref(db1, 'prio'), orderByPriority()));
  const order = [];
  s.forEach((c) => { order.push(c.key); });
  assertEqual(order, ['b', 'c', 'a'], 'priority order');
  const exported = await rest(2, 'prio/a');
  assertEqual(exported, 'A', 'REST value');
});

// The SDK cuts its messages into 16,384 UTF-16 units, so a character outside the BMP that
// straddles a cut reaches any server as two U+FFFD (reference §1.3; nothing a server can repair):
// the large value uses 2- and 3-byte characters, and the small one below checks 4-byte ones.
check('large values span many frames both ways (300 KB, multi-byte text)', async () => {
  await set(ref(db0, 'emoji'), '😀 ok');
  assertEqual((await get(ref(db1, 'emoji'))).val(), '😀 ok', 'a 4-byte character');
  const big = 'äx€y'.repeat(75000);
  const seen = waitFor(ref(db1, 'big'), (v) => v === big, 20000, 'the big value on another node');
  await set(ref(db0, 'big'), big);
  await seen;
  assertEqual((await get(ref(db2, 'big'))).val().length, big.length, 'length read back');
});

check('onDisconnect set, update and cancel fire once when the connection ends', async () => {
  const db3 = connect(2);
  await set(ref(db3, 'presence/u1'), 'online');
  await onDisconnect(ref(db3, 'presence/u1')).set('offline');
  await onDisconnect(ref(db3, 'presence/meta')).update({ left: true, at: serverTimestamp() });
  await onDisconnect(ref(db3, 'presence/cancelled')).set('should not appear');
  await onDisconnect(ref(db3, 'presence/cancelled')).cancel();
  const offline = waitFor(ref(db0, 'presence'), (v) => v && v.u1 === 'offline', 15000, 'offline after the disconnect');
  goOffline(db3);
  const snap = await offline;
  const v = snap.val();
  assertEqual(v.meta.left, true, 'onDisconnect update');
  if (typeof v.meta.at !== 'number') throw new Error('server timestamp in onDisconnect not resolved');
  if ('cancelled' in v) throw new Error('a cancelled onDisconnect write fired');
});

check('a reconnect (goOffline, goOnline) restores listens and writes queued offline', async () => {
  const db4 = connect(1);
  await set(ref(db4, 'offline/x'), 1);
  goOffline(db4);
  const written = set(ref(db4, 'offline/x'), 2);
  goOnline(db4);
  await written;
  assertEqual(await rest(0, 'offline/x'), 2, 'the queued write applied');
});

check('remove deletes and listeners see null', async () => {
  await set(ref(db0, 'gone'), { a: 1 });
  const seenNull = waitFor(ref(db1, 'gone'), (v) => v === null, 10000, 'null after remove');
  await remove(ref(db0, 'gone'));
  await seenNull;
});

// A loopback front: each new connection goes to the first node in `order` that accepts it, as
// a load balancer in front of the cluster would (the SDK in emulator mode reconnects to the host
// it was given, so failover needs one address for all nodes).
function front(order) {
  const server = net.createServer((client) => {
    client.pause();
    const attempt = (k) => {
      if (k >= order.length) { client.destroy(); return; }
      const [host, port] = nodes[order[k]].split(':');
      const upstream = net.connect(Number(port), host);
      upstream.once('error', () => attempt(k + 1));
      upstream.once('connect', () => {
        upstream.removeAllListeners('error');
        const end = () => { client.destroy(); upstream.destroy(); };
        upstream.on('error', end);
        client.on('error', end);
        upstream.on('close', end);
        client.on('close', end);
        client.pipe(upstream);
        upstream.pipe(client);
        client.resume();
      });
    };
    attempt(0);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

// Last: it leaves one node dead. A client behind the front is on the leader (the victim) when
// that node is killed with SIGKILL; it reconnects through the front to another node and must see
// every event once, in order, keep its writes, and its old connection's onDisconnect must fire
// (the new node ends it, named by `ls`). The nodes of `banyan cluster local` have ids 1, 2, 3 in
// the order of the addresses given.
check('kill -9 of the leader a client is on: it reconnects elsewhere and sees every event once, in order', async () => {
  if (nodes.length < 3) throw new Error('needs three nodes');
  const leader = (await (await fetch(`http://${nodes[0]}/.banyan/status`)).json()).leader;
  const victim = leader >= 1 && leader <= nodes.length ? leader - 1 : 1;
  const status = await (await fetch(`http://${nodes[victim]}/.banyan/status`)).json();
  if (!status.pid) throw new Error('no pid in the victim\'s status');
  if (status.role !== 'leader') console.log(`      (the victim, node ${status.nodeID}, is a ${status.role})`);
  const others = [0, 1, 2].filter((k) => k !== victim);
  const proxy = await front([victim, ...others]);
  const proxyPort = proxy.address().port;
  const app = initializeApp({ projectId: 'demo', databaseURL: `http://127.0.0.1:${proxyPort}?ns=${ns}` }, `app${appCount++}`);
  apps.push(app);
  const client = getDatabase(app);
  connectDatabaseEmulator(client, '127.0.0.1', proxyPort);
  const writer = [db0, db1, db2][others[0]];  // never on the victim

  // A second client straight on the victim: it can only retry the dead node, so nothing names
  // its connection with `ls`; the leader's lease expiry must fire its onDisconnect.
  const stranded = connect(victim);
  await set(ref(stranded, 'failover/stranded'), 'here');
  await onDisconnect(ref(stranded, 'failover/stranded')).set('gone');

  const seen = [];
  const counts = new Map();
  // Whole snapshots too: each must extend the previous one (the view never moves backwards or
  // loses an event across the failover; child events alone would hide that).
  const snapshots = [];
  onValue(ref(client, 'failover/events'), (s) => { snapshots.push(Object.keys(s.val() || {})); });
  onChildAdded(ref(client, 'failover/events'), (s) => {
    seen.push(s.key);
    counts.set(s.key, (counts.get(s.key) || 0) + 1);
  });
  await waitFor(ref(client, '.info/connected'), (v) => v === true, 10000, 'the client connected through the front');
  await set(ref(client, 'failover/presence'), 'online');
  await onDisconnect(ref(client, 'failover/presence')).set('offline');

  const pushed = [];
  const clientWrites = [];
  let killedAt = -1;
  for (let i = 0; i < 80; i++) {
    pushed.push((await push(ref(writer, 'failover/events'), { i })).key);
    clientWrites.push(set(ref(client, `failover/c/w${i}`), i));
    if (i === 25) {
      process.kill(status.pid, 'SIGKILL');
      killedAt = i;
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  if (killedAt < 0) throw new Error('the victim was not killed');
  await Promise.all(clientWrites);  // every write the client made is acknowledged in the end
  const d = deadline(30000, 'every event at the client');
  await Promise.race([new Promise((resolve) => {
    const poll = setInterval(() => { if (seen.length >= pushed.length) { clearInterval(poll); resolve(); } }, 50);
  }), d.p]);
  d.cancel();
  assertEqual(seen, pushed, 'events at the client, once each and in order');
  for (let k = 1; k < snapshots.length; k++) {
    const before = snapshots[k - 1];
    const after = snapshots[k];
    if (after.length < before.length || before.some((key, j) => after[j] !== key)) {
      throw new Error(`snapshot ${k} does not extend snapshot ${k - 1} (${before.length} → ${after.length} keys)`);
    }
  }
  assertEqual(snapshots[snapshots.length - 1], pushed, 'the last snapshot');
  const twice = [...counts.values()].filter((n) => n !== 1).length;
  if (twice) throw new Error(`${twice} events delivered more than once`);
  const stored = await rest(others[0], 'failover/c');
  for (let i = 0; i < 80; i++) assertEqual(stored[`w${i}`], i, `the client's write ${i}`);
  // The old connection (on the dead node) ended when the client reconnected naming it.
  // Well inside the dead node's lease (20 s): only the `ls` of the reconnect can have done it.
  await waitFor(ref(writer, 'failover/presence'), (v) => v === 'offline', 10000, 'onDisconnect of the dead node\'s connection, ended by ls');
  // The stranded client's: after the node's lease (20 s, counted from the new leader's
  // election) the leader ends its connections.
  const t0 = Date.now();
  await waitFor(ref(writer, 'failover/stranded'), (v) => v === 'gone', 45000, 'onDisconnect through the dead node\'s lease');
  console.log(`      (the dead node's lease expired ${Date.now() - t0} ms after the reconnected client caught up)`);
  proxy.close();
});

// Run after the kill -9 (one node is dead): `POST /.banyan/drain` on a live node with no
// targets named sends its clients to the other members that published a client address and
// answer ready, so never to a dead node. A client on it gets the reset (`r`), reconnects to the other
// live node, and sees every event once, in order; its writes all apply, its transactions once each.
check('drain: a node\'s clients move to the other live node with the reset, losing no events', async () => {
  const alive = [];
  for (let k = 0; k < nodes.length; k++) {
    try {
      const r = await fetch(`http://${nodes[k]}/.banyan/ready`);
      if (r.status === 200) alive.push(k);
    } catch (e) { /* dead */ }
  }
  if (alive.length < 2) throw new Error(`needs two ready nodes, found ${alive.length}`);
  const [stay, drained] = alive;
  const client = connect(drained);
  const writer = connect(stay);
  const seen = [];
  const counts = new Map();
  onChildAdded(ref(client, 'drain/events'), (s) => {
    seen.push(s.key);
    counts.set(s.key, (counts.get(s.key) || 0) + 1);
  });
  await waitFor(ref(client, '.info/connected'), (v) => v === true, 10000, 'the client connected');
  await set(ref(client, 'drain/start'), true);
  const pushed = [];
  const clientWrites = [];
  const transactions = [];
  let answer = null;
  for (let i = 0; i < 40; i++) {
    pushed.push((await push(ref(writer, 'drain/events'), { i })).key);
    clientWrites.push(set(ref(client, `drain/c/w${i}`), i));
    // Transactions in flight across the move: each counts once or not at all (the SDK fails a
    // transaction it sent but saw no answer to when its connection closes, with 'disconnect';
    // the node answers everything it read before the reset and reads nothing after it).
    // (Settled at once: a rejection left unhandled until later would end the process.)
    transactions.push(runTransaction(ref(client, 'drain/counter'), (v) => (v || 0) + 1).then(
      (value) => ({ status: 'fulfilled', value }), (reason) => ({ status: 'rejected', reason })));
    if (i === 10) {
      const res = await fetch(`http://${nodes[drained]}/.banyan/drain`, { method: 'POST', headers: { 'Content-Type': 'application/json' } });
      answer = await res.json();
      if (res.status !== 200) throw new Error(`drain refused: ${res.status} ${JSON.stringify(answer)}`);
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  assertEqual(answer.targets, alive.filter((k) => k !== drained).map((k) => nodes[k]), 'drain targets (the other live nodes only)');
  await Promise.all(clientWrites);
  const d = deadline(20000, 'every event at the drained client');
  await Promise.race([new Promise((resolve) => {
    const poll = setInterval(() => { if (seen.length >= pushed.length) { clearInterval(poll); resolve(); } }, 50);
  }), d.p]);
  d.cancel();
  assertEqual(seen, pushed, 'events at the client, once each and in order');
  const twice = [...counts.values()].filter((n) => n !== 1).length;
  if (twice) throw new Error(`${twice} events delivered more than once`);
  const stored = await rest(stay, 'drain/c');
  for (let i = 0; i < 40; i++) assertEqual(stored[`w${i}`], i, `the client's write ${i}`);
  const outcomes = await Promise.all(transactions);
  const committed = outcomes.filter((o) => o.status === 'fulfilled' && o.value.committed).length;
  const odd = outcomes.filter((o) => o.status === 'rejected' && String(o.reason && o.reason.message) !== 'disconnect');
  if (odd.length) throw new Error(`a transaction failed otherwise than by the disconnect: ${odd[0].reason}`);
  if (committed < 30) throw new Error(`only ${committed} of 40 transactions committed`);
  assertEqual(await rest(stay, 'drain/counter'), committed, 'the counter: every committed transaction once, no other');
  let left = -1;
  for (let t = 0; t < 40 && left !== 0; t++) {
    left = (await (await fetch(`http://${nodes[drained]}/.banyan/drain`)).json()).connections;
    if (left !== 0) await new Promise((r) => setTimeout(r, 250));
  }
  assertEqual(left, 0, 'realtime connections left on the drained node');
  assertEqual((await fetch(`http://${nodes[drained]}/.banyan/ready`)).status, 503, 'ready while draining');
  await set(ref(client, 'drain/after'), 'moved');  // the client works on its new node
  assertEqual(await rest(drained, 'drain/after'), 'moved', 'the write after the move');
  const stopped = await fetch(`http://${nodes[drained]}/.banyan/drain`, { method: 'DELETE' });
  assertEqual(stopped.status, 200, 'stop draining');
});

// Last: security rules in this run's namespace, with the SDK's emulator-style mock token.
check('security rules: a mock-token user and a signed-token user write only their own records; a forged token and signed-out clients are refused', async () => {
  const rules = JSON.stringify({ rules: {
    secure: { $uid: { '.read': 'auth != null && auth.uid == $uid', '.write': 'auth != null && auth.uid == $uid',
      '.validate': "newData.hasChildren(['name'])" } },
  } });
  // One node may be dead (the kill -9 check): use the ready ones.
  const live = [];
  for (let k = 0; k < nodes.length; k++) {
    try { if ((await fetch(`http://${nodes[k]}/.banyan/ready`)).status === 200) live.push(k); } catch (e) { /* dead */ }
  }
  if (live.length < 1) throw new Error('no ready node');
  const other = live[live.length - 1];
  const put = await fetch(`http://${nodes[live[0]]}/.settings/rules.json?ns=${ns}&auth=owner`, { method: 'PUT', body: rules });
  assertEqual(put.status, 200, 'PUT /.settings/rules.json');
  const signedOut = connect(live[0]);
  const [host, port] = nodes[other].split(':');
  const app = initializeApp({ projectId: 'demo', databaseURL: `http://${host}:${port}?ns=${ns}` }, `app${appCount++}`);
  apps.push(app);
  const alice = getDatabase(app);
  connectDatabaseEmulator(alice, host, Number(port), { mockUserToken: { sub: 'alice', user_id: 'alice' } });
  const denied = async (p, what) => {
    try { await p; } catch (e) {
      if (String(e && e.message).toLowerCase().includes('permission')) return;
      throw new Error(`${what}: failed otherwise: ${e && e.message}`);
    }
    throw new Error(`${what}: allowed`);
  };
  await set(ref(alice, 'secure/alice'), { name: 'Alice' });
  await denied(set(ref(alice, 'secure/bob'), { name: 'Bob' }), "alice writing bob's record");
  await denied(set(ref(alice, 'secure/alice'), { age: 3 }), 'a record without a name (.validate)');
  await update(ref(alice, 'secure/alice'), { age: 3 });
  assertEqual((await get(ref(alice, 'secure/alice'))).val(), { age: 3, name: 'Alice' }, "alice's record read by alice");
  await denied(set(ref(signedOut, 'secure/alice'), { name: 'Mallory' }), 'a signed-out write');
  await denied(get(ref(signedOut, 'secure/alice')), 'a signed-out read');
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('a signed-out listen was neither cancelled nor answered')), 10000);
    onValue(ref(signedOut, 'secure/alice'), () => { clearTimeout(timer); reject(new Error('a signed-out listen got data')); },
      (err) => { clearTimeout(timer); if (String(err.message).toLowerCase().includes('permission')) resolve(); else reject(err); });
  });
  assertEqual(await (await fetch(`http://${nodes[other]}/secure/alice.json?ns=${ns}&auth=owner`)).json(), { age: 3, name: 'Alice' }, 'REST read by the administrator');
  // A signed token, not a mock one: an ID token of the node's own account service (an anonymous
  // sign-up), given to the SDK as its token string; it is verified on the node like any.
  const signUp = await fetch(`http://${nodes[other]}/identitytoolkit.googleapis.com/v1/accounts:signUp?key=interop`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ returnSecureToken: true }),
  });
  assertEqual(signUp.status, 200, 'an anonymous sign-up');
  const { idToken, localId } = await signUp.json();
  if (!idToken || !localId || idToken.split('.').length !== 3 || idToken.endsWith('.')) throw new Error('the sign-up gave no signed ID token');
  const signedApp = initializeApp({ projectId: 'demo', databaseURL: `http://${host}:${port}?ns=${ns}` }, `app${appCount++}`);
  apps.push(signedApp);
  const signed = getDatabase(signedApp);
  connectDatabaseEmulator(signed, host, Number(port), { mockUserToken: idToken });
  await set(ref(signed, `secure/${localId}`), { name: 'Anonymous' });
  await denied(set(ref(signed, 'secure/alice'), { name: 'Not Alice' }), "a signed-token user writing alice's record");
  assertEqual((await get(ref(signed, `secure/${localId}`))).val(), { name: 'Anonymous' }, 'its own record, read with its signed token');
  // The same token with its payload changed under the same signature is refused.
  const [head, payload, sig] = idToken.split('.');
  const claims = JSON.parse(Buffer.from(payload, 'base64url').toString());
  claims.user_id = 'alice';
  claims.sub = 'alice';
  const forged = [head, Buffer.from(JSON.stringify(claims)).toString('base64url'), sig].join('.');
  const forgedApp = initializeApp({ projectId: 'demo', databaseURL: `http://${host}:${port}?ns=${ns}` }, `app${appCount++}`);
  apps.push(forgedApp);
  const forgedDb = getDatabase(forgedApp);
  connectDatabaseEmulator(forgedDb, host, Number(port), { mockUserToken: forged });
  // The node answers its auth with invalid_token (as Firebase does, the SDK then keeps trying to
  // authenticate and holds the write): it is never acknowledged, and alice's record is unchanged.
  const forgedWrite = await Promise.race([
    set(ref(forgedDb, 'secure/alice'), { name: 'Forged' }).then(() => 'written', () => 'refused'),
    new Promise((resolve) => setTimeout(() => resolve('held'), 3000)),
  ]);
  if (forgedWrite === 'written') throw new Error('a forged token wrote as alice');
  goOffline(forgedDb);
  assertEqual(await (await fetch(`http://${nodes[other]}/secure/alice.json?ns=${ns}&auth=owner`)).json(), { age: 3, name: 'Alice' }, "alice's record after the forged write");
  const removed = await fetch(`http://${nodes[live[0]]}/.settings/rules.json?ns=${ns}&auth=owner`, { method: 'PUT', body: '' });
  assertEqual(removed.status, 200, 'rules removed');
});

check('a namespace quota: a write over it fails with the server\'s QUOTA reason, a delete goes on, a transaction over it fails', async () => {
  const live = [];
  for (let k = 0; k < nodes.length; k++) {
    try { if ((await fetch(`http://${nodes[k]}/.banyan/ready`)).status === 200) live.push(k); } catch (e) { /* dead */ }
  }
  if (live.length < 1) throw new Error('no ready node');
  const qns = ns + 'q';
  const quota = await fetch(`http://${nodes[live[0]]}/.settings/quota.json?ns=${qns}&auth=owner`, { method: 'PUT', body: '40' });
  assertEqual(quota.status, 200, 'PUT /.settings/quota.json');
  const [host, port] = nodes[live[live.length - 1]].split(':');
  const app = initializeApp({ projectId: 'demo', databaseURL: `http://${host}:${port}?ns=${qns}` }, `app${appCount++}`);
  apps.push(app);
  const db = getDatabase(app);
  connectDatabaseEmulator(db, host, Number(port));
  await set(ref(db, 'a'), '0123456789012345678901234');  // 1 + 25 data bytes
  const refused = async (p, what) => {
    try { await p; } catch (e) {
      if (String(e && e.message).includes('QUOTA: namespace')) return;
      throw new Error(`${what}: failed otherwise: ${e && e.message}`);
    }
    throw new Error(`${what}: accepted`);
  };
  await refused(set(ref(db, 'b'), '0123456789012345'), 'a set over the quota');
  await refused(update(ref(db), { c: '0123456789012345' }), 'an update over the quota');
  // A transaction's commit is judged like a set; the SDK reports a failed transaction by its
  // status alone ('failure'), without the reason.
  let committed = false;
  try {
    await runTransaction(ref(db, 'a'), (v) => (v || '') + 'more than the quota allows');
    committed = true;
  } catch (e) {
    if (String(e && e.message) !== 'failure') throw new Error(`the transaction failed otherwise: ${e && e.message}`);
  }
  if (committed) throw new Error('a transaction over the quota committed');
  assertEqual((await get(ref(db, 'a'))).val(), '0123456789012345678901234', 'the value after the refused transaction');
  await set(ref(db, 'a'), 'short');
  await remove(ref(db, 'a'));
  assertEqual(await (await fetch(`http://${nodes[live[0]]}/.json?ns=${qns}`)).json(), null, 'the namespace after the delete');
  const used = await (await fetch(`http://${nodes[live[0]]}/.settings/quota.json?ns=${qns}&auth=owner`)).json();
  assertEqual(used, { namespace: qns, quota_bytes: 40, used_bytes: 0 }, 'GET /.settings/quota.json');
});

(async () => {
  let failed = 0;
  const started = Date.now();
  for (const c of checks) {
    const t = Date.now();
    const d = deadline(90000, c.name);
    try {
      await Promise.race([c.fn(), d.p]);
      console.log(`ok    ${c.name} (${Date.now() - t} ms)`);
    } catch (e) {
      failed++;
      console.log(`FAIL  ${c.name}: ${short(e && e.message ? e.message : String(e))}`);
    } finally {
      d.cancel();
    }
  }
  console.log(`${checks.length - failed}/${checks.length} checks passed in ${Date.now() - started} ms (namespace ${ns})`);
  await Promise.all(apps.map((a) => deleteApp(a).catch(() => {})));
  process.exit(failed);
})();
