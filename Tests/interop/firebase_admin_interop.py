"""Drives the official firebase-admin Python SDK against a running Banyan node, the way it is
pointed at the Firebase emulator (FIREBASE_DATABASE_EMULATOR_HOST). Run by .ci/run.

Usage: python firebase_admin_interop.py HOST:PORT [HOST:PORT ...]
The first node takes the writes; the listener and reads use the others, so the test also shows
that every node serves the same tree.
"""
import sys
import threading

import firebase_admin
from firebase_admin import db
from interop_checks import Anonymous, check, finish

nodes = sys.argv[1:] or ["127.0.0.1:9000"]


def app_for(node, name):
    # An http:// database URL with ?ns= is the emulator form: requests go to that host with
    # `ns=interop` and `Authorization: Bearer owner`.
    return firebase_admin.initialize_app(
        Anonymous(), {"databaseURL": f"http://{node}?ns=interop", "projectId": "interop"}, name=name
    )


writer = app_for(nodes[0], "writer")
reader = app_for(nodes[-1], "reader")
root = db.reference("/", app=writer)
other = db.reference("/", app=reader)

# set / get
root.child("interop").delete()
base = root.child("interop")
base.child("users/ada").set({"name": "Ada Lovelace", "born": 1815, "tags": {"math": True}})
check("get after set (other node)", other.child("interop/users/ada").get(), {"name": "Ada Lovelace", "born": 1815, "tags": {"math": True}})
check("get a leaf", base.child("users/ada/born").get(), 1815)
check("get missing", base.child("nobody").get(), None)

# update (multi-path)
base.child("users").update({"ada/born": 1816, "grace/name": "Grace Hopper"})
check("update", other.child("interop/users").get(), {"ada": {"name": "Ada Lovelace", "born": 1816, "tags": {"math": True}}, "grace": {"name": "Grace Hopper"}})

# push
pushed = base.child("messages").push({"text": "hello"})
check("push key shape", len(pushed.key) == 20 and pushed.key.startswith("-"), True)
check("push value", other.child(f"interop/messages/{pushed.key}").get(), {"text": "hello"})
second = base.child("messages").push("second")
check("push ids are time-ordered", pushed.key < second.key, True)

# shallow and queries
base.child("scores").set({"a": {"s": 5}, "b": {"s": 1}, "c": {"s": 9}, "d": {"s": 7}})
check("shallow", other.child("interop/scores").get(shallow=True), {"a": True, "b": True, "c": True, "d": True})
top = base.child("scores").order_by_child("s").limit_to_last(2).get()
check("order_by_child limit_to_last", list(top.keys()), ["d", "c"])
ranged = base.child("scores").order_by_child("s").start_at(5).end_at(7).get()
check("order_by_child start_at end_at", list(ranged.keys()), ["a", "d"])
keys = base.child("scores").order_by_key().limit_to_first(2).get()
check("order_by_key limit_to_first", list(keys.keys()), ["a", "b"])
values = base.child("scores").order_by_child("s").equal_to(9).get()
check("equal_to", values, {"c": {"s": 9}})

# etags and conditional writes
value, etag = base.child("users/ada/born").get(etag=True)
check("get with etag", value, 1816)
ok, new_value, new_etag = base.child("users/ada/born").set_if_unchanged(etag, 1817)
check("set_if_unchanged succeeds", (ok, new_value), (True, 1817))
ok, current, _ = base.child("users/ada/born").set_if_unchanged(etag, 1900)
check("set_if_unchanged with a stale etag fails with the current value", (ok, current), (False, 1817))
changed, _, _ = base.child("users/ada/born").get_if_changed(new_etag)
check("get_if_changed (unchanged: 304)", changed, False)

# a contended transaction: 4 threads x 10 increments through two nodes
base.child("counter").set(0)


def bump(ref, n):
    for _ in range(n):
        ref.transaction(lambda current: (current or 0) + 1)


threads = [threading.Thread(target=bump, args=((root if i % 2 == 0 else other).child("interop/counter"), 10)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
check("contended transaction", other.child("interop/counter").get(), 40)

# listen (SSE) through the other node
events = []
got = threading.Event()
opened = threading.Event()


def on_event(event):
    events.append((event.event_type, event.path, event.data))
    opened.set()
    if event.event_type == "put" and event.path == "/live/x" and event.data == 42:
        got.set()


registration = other.child("interop").listen(on_event)
# The write goes after the first event (the whole value), or it could arrive inside that value.
check("listen opens", opened.wait(10), True)
base.child("live/x").set(42)
check("listen receives the write", got.wait(10), True)
check("listen: first event is the whole value", events[0][0:2] if events else None, ("put", "/"))
registration.close()

# delete
base.child("users/grace").delete()
check("delete", other.child("interop/users/grace").get(), None)

# A namespace quota (a Banyan extension, docs/operations.md): a write over it raises the SDK's
# error with the server's QUOTA reason (REST 507); a delete goes on.
import urllib.request

quota_ns = "interopquota"
request = urllib.request.Request(f"http://{nodes[0]}/.settings/quota.json?ns={quota_ns}&auth=owner", data=b"30", method="PUT")
check("PUT /.settings/quota.json", urllib.request.urlopen(request, timeout=10).status, 200)
quota_app = firebase_admin.initialize_app(
    Anonymous(), {"databaseURL": f"http://{nodes[0]}?ns={quota_ns}", "projectId": "interop"}, name="quota"
)
quota_root = db.reference("/", app=quota_app)
quota_root.child("a").set("0123456789")
try:
    quota_root.child("b").set("01234567890123456789")
    check("a set over the quota raises", "accepted", "raised")
except Exception as error:  # firebase_admin.exceptions.FirebaseError (UnknownError for 507)
    check("a set over the quota raises with the QUOTA reason", "QUOTA: namespace interopquota holds 11 bytes" in str(error), True)
quota_root.child("a").delete()
check("a delete goes on", quota_root.get(), None)

finish("firebase-admin interop")
