// The unmodified Firebase JavaScript SDK (vendored in firebase-js-11/) through `banyan chaos
// proxy`, which resets every connection every few seconds (docs/chaos.md, docs/runbook.md
// "Failover testing for app teams"). Run by .ci/run:
//   banyan chaos proxy --listen 127.0.0.1:P --to 127.0.0.1:N --reset-every 3 &
//   node Tests/interop/firebase_js_chaos_proxy.js 127.0.0.1:P 127.0.0.1:N
// An app connected through the proxy must see its connection drop (.info/connected false) and
// come back by itself, keep receiving what another client writes directly to the node, and
// have its own writes made while disconnected delivered once it is back. Exit status: the number
// of failed checks (bounded: about 40 s at most).
'use strict';
const path = require('path');
const { createRequire } = require('module');
const req = createRequire(path.join(__dirname, 'firebase-js-11') + '/');
const { initializeApp, deleteApp } = req('firebase/app');
const { getDatabase, connectDatabaseEmulator, ref, set, onValue } = req('firebase/database');

const [viaProxy, direct] = process.argv.slice(2);
if (!viaProxy || !direct) {
  console.error('usage: node firebase_js_chaos_proxy.js proxy-host:port node-host:port');
  process.exit(64);
}
const ns = 'jschaos' + Date.now().toString(36);

function connect(address, name) {
  const [host, port] = address.split(':');
  const app = initializeApp({ projectId: 'demo', databaseURL: `http://${host}:${port}?ns=${ns}` }, name);
  const db = getDatabase(app);
  connectDatabaseEmulator(db, host, Number(port));
  return { app, db };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const app = connect(viaProxy, 'through-proxy');
  const other = connect(direct, 'direct');
  const transitions = [];
  onValue(ref(app.db, '.info/connected'), (snap) => transitions.push(snap.val()));
  let seen = -1;
  onValue(ref(app.db, 'counter'), (snap) => { if (typeof snap.val() === 'number') seen = Math.max(seen, snap.val()); });
  let failures = 0;
  const fail = (what) => { failures += 1; console.log(`FAIL ${what}`); };

  // Another client writes a counter straight to the node for 12 s (four resets at 3 s).
  const started = Date.now();
  let written = 0;
  while (Date.now() - started < 12000) {
    written += 1;
    await set(ref(other.db, 'counter'), written);
    await sleep(250);
  }
  // The app writes too; a write made while its connection is down is sent after it comes back.
  const mine = `from the app at ${Date.now()}`;
  const ack = set(ref(app.db, 'mine'), mine);
  const until = Date.now() + 20000;
  while (seen < written && Date.now() < until) await sleep(100);
  const downs = transitions.filter((v) => v === false).length;
  const ups = transitions.filter((v) => v === true).length;
  console.log(`.info/connected went false ${downs} times and true ${ups} times; last counter value seen ${seen} of ${written}`);
  if (downs < 2) fail(`the proxy's resets were not seen (.info/connected false ${downs} times)`);
  if (transitions[transitions.length - 1] !== true) fail('the app did not reconnect');
  if (seen !== written) fail(`the app saw counter ${seen}, not the last write ${written}`);
  try {
    await Promise.race([ack, sleep(20000).then(() => { throw new Error('not acknowledged within 20 s'); })]);
    let stored = null;
    onValue(ref(other.db, 'mine'), (snap) => { stored = snap.val(); });
    const deadline = Date.now() + 10000;
    while (stored !== mine && Date.now() < deadline) await sleep(100);
    if (stored !== mine) fail(`the app's write did not reach the node (read ${JSON.stringify(stored)})`);
    else console.log('the app\'s write, made through the resetting proxy, reached the node');
  } catch (e) {
    fail(`the app's write: ${e.message}`);
  }
  await deleteApp(app.app);
  await deleteApp(other.app);
  console.log(failures === 0 ? 'chaos proxy: the SDK rode through every reset' : `chaos proxy: ${failures} failed`);
  process.exit(failures);
}

setTimeout(() => { console.log('FAIL: the script took longer than 60 s'); process.exit(100); }, 60000).unref();
main().catch((e) => { console.log(`FAIL ${e.stack}`); process.exit(99); });
