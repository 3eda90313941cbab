"""Drives Pyrebase4 (a REST client that sends no `ns`: the namespace comes from the Host) against
a running Banyan node. Run by .ci/run. Usage: python pyrebase_interop.py HOST:PORT"""
import sys
import threading

import pyrebase

failures = []


def check(name, got, want):
    print(("ok   " if got == want else "FAIL ") + name + ("" if got == want else f": got {got!r}, want {want!r}"))
    if got != want:
        failures.append(name)


node = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9000"
db = pyrebase.initialize_app(
    {"apiKey": "unused", "authDomain": "unused", "databaseURL": f"http://{node}", "storageBucket": "unused"}
).database()

db.child("pyre").remove()
db.child("pyre").child("ada").set({"name": "Ada", "age": 36})
check("set and get", dict(db.child("pyre").child("ada").get().val()), {"name": "Ada", "age": 36})
pushed = db.child("pyre").push({"age": 20})
check("push returns a name", len(pushed["name"]), 20)
db.child("pyre").child("ada").update({"age": 37})
check("update", db.child("pyre").child("ada").child("age").get().val(), 37)
youngest = db.child("pyre").order_by_child("age").limit_to_first(1).get().val()
check("order_by_child limit_to_first", list(youngest.keys()), [pushed["name"]])
check("shallow", sorted(db.child("pyre").shallow().get().val()), sorted(["ada", pushed["name"]]))

seen = threading.Event()
started = threading.Event()
events = []


def handler(message):
    events.append((message["event"], message["path"], message["data"]))
    started.set()
    if message["path"] == "/live" and message["data"] == 5:
        seen.set()


stream = db.child("pyre").stream(handler)
check("stream opens", started.wait(10), True)
db.child("pyre").child("live").set(5)
check("stream receives the write", seen.wait(10), True)
try:
    stream.close()
except AttributeError:
    pass  # Pyrebase4's close() reaches into urllib3 internals that newer urllib3 no longer has
check("stream starts with the whole value", events[0][:2] if events else None, ("put", "/"))
db.child("pyre").child("ada").remove()
check("remove", db.child("pyre").child("ada").get().val(), None)

if failures:
    sys.exit(1)
print("Pyrebase4 interop: all checks passed")
