"""Service accounts with unmodified Google clients (docs/security.md, "Service accounts"): key
files made by `banyan service-account create`, a node that trusts one of them (closed rules, no
development access). Pyrebase4 (oauth2client) exchanges its assertion at the key file's
token_uri and sends the access token as a bearer; firebase-admin's credentials.Certificate
(google-auth) does the same exchange. Run by .ci/run.

Usage: python service_account_interop.py HOST:PORT TRUSTED_KEY UNTRUSTED_KEY"""
import sys
import threading

import pyrebase
import requests
from firebase_admin import credentials

failures = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))
    if not ok:
        failures.append(name)


node, trusted, untrusted = sys.argv[1], sys.argv[2], sys.argv[3]
base = {"apiKey": "unused", "authDomain": "unused", "databaseURL": f"http://{node}", "storageBucket": "unused"}

admin = pyrebase.initialize_app(dict(base, serviceAccount=trusted)).database()
admin.child("vault").remove()
admin.child("vault").child("a").set({"n": 1})
admin.child("vault").child("a").update({"m": 2})
pushed = admin.child("vault").push({"n": 3})
got = admin.child("vault").get().val()
check("Pyrebase with the service account: set, update, push, get under closed rules",
      dict(got["a"]) == {"n": 1, "m": 2} and dict(got[pushed["name"]]) == {"n": 3}, repr(got))

events = []
started = threading.Event()
seen = threading.Event()


def handler(message):
    events.append(message)
    if message["event"] == "put" and message["path"] == "/":
        started.set()
    if message["event"] == "put" and message["path"] == "/b":
        seen.set()


stream = admin.child("vault").stream(handler)
# The write goes after the stream's first event (the whole value): written before it, the write
# would arrive inside that value instead of as an event of its own (seen once in CI).
check("Pyrebase stream with the service account starts with the whole value", started.wait(20), True)
admin.child("vault").child("b").set(4)
check("Pyrebase stream with the service account sees a write", seen.wait(20), repr(events))
try:
    stream.close()
except AttributeError:
    pass  # Pyrebase4's close() reaches into urllib3 internals that are not always there (as in pyrebase_interop.py)


def refused(call):
    try:
        call()
        return None
    except Exception as e:  # Pyrebase raises requests' HTTPError with the body
        return str(e)


plain = pyrebase.initialize_app(base).database()
why = refused(lambda: plain.child("vault").get())
check("Pyrebase without credentials: reading is refused", why is not None and "401" in why, repr(why))
why = refused(lambda: plain.child("vault").child("x").set(1))
check("Pyrebase without credentials: writing is refused", why is not None and "401" in why, repr(why))

stranger = pyrebase.initialize_app(dict(base, serviceAccount=untrusted)).database()
why = refused(lambda: stranger.child("vault").child("x").set(1))
check("Pyrebase with a key the node does not trust: the token exchange is refused (invalid_grant)",
      why is not None and "invalid_grant" in why, repr(why))

# firebase-admin's service-account credential (google-auth): its assertion names Google's token
# endpoint as the audience, which the node's configuration lists.
token = credentials.Certificate(trusted).get_access_token()
r = requests.get(f"http://{node}/vault/a/m.json", headers={"Authorization": "Bearer " + token.access_token}, timeout=30)
check("firebase-admin credentials.Certificate: its access token reads", r.status_code == 200 and r.text == "2", f"{r.status_code} {r.text}")
why = refused(lambda: credentials.Certificate(untrusted).get_access_token())
check("firebase-admin credentials.Certificate with an untrusted key: refused", why is not None and "invalid_grant" in why, repr(why))

final = admin.child("vault").get().val()
check("nothing the refused clients sent was written", "x" not in final, repr(final))

print(f"{len(failures)} failed" if failures else "all service-account checks passed")
sys.exit(1 if failures else 0)
