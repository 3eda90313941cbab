"""Drives the official firebase-admin Python SDK's auth API against Banyan's account service, the
way it is pointed at the Firebase Auth emulator (FIREBASE_AUTH_EMULATOR_HOST), then uses the ID
tokens it yields on the REST API under security rules. Run by .ci/run.

Usage: python firebase_admin_auth_interop.py HOST:PORT [HOST:PORT ...]
The admin SDK talks to the first node; sign-ins go to the others (the client half of the
Identity Toolkit, as the JavaScript SDK would call it), and database requests to the last, so
accounts and signing keys are shown to be replicated.
"""
import base64
import os
import sys
import time

nodes = sys.argv[1:] or ["127.0.0.1:9000"]
os.environ["FIREBASE_AUTH_EMULATOR_HOST"] = nodes[0]

import firebase_admin  # noqa: E402 (the emulator host must be set first)
import requests  # noqa: E402
from firebase_admin import auth  # noqa: E402
from interop_checks import Anonymous, check, finish, raises  # noqa: E402

# The project a node serves by default (accounts.project_id); others are refused but to an
# administrator, and their tokens never honoured.
PROJECT = "demo-banyan"
OTHER_PROJECT = "interop-other"
NAMESPACE = "interopauth"

app = firebase_admin.initialize_app(Anonymous(), {"projectId": PROJECT}, name="auth")


def toolkit(node, operation, body):
    """The client half: what the JavaScript SDK sends (no administrator credentials)."""
    r = requests.post(f"http://{node}/identitytoolkit.googleapis.com/v1/projects/{PROJECT}/accounts:{operation}?key=fake-api-key", json=body, timeout=30)
    return r.status_code, r.json()


def admin_toolkit(node, path, body, project=PROJECT):
    """A raw Identity Toolkit call with the emulator's administrator token, so the server's own
    answer is checked (firebase-admin validates some input before sending anything)."""
    r = requests.post(f"http://{node}/identitytoolkit.googleapis.com/v1/projects/{project}/{path}", json=body,
                      headers={"Authorization": "Bearer owner"}, timeout=30)
    return r.status_code, r.json()


def refresh(node, token):
    r = requests.post(
        f"http://{node}/securetoken.googleapis.com/v1/token?key=fake-api-key",
        data={"grant_type": "refresh_token", "refresh_token": token},
        timeout=30,
    )
    return r.status_code, r.json()


def error_code(answer):
    return answer.get("error", {}).get("message", "").split(" : ")[0]


def db(method, path, token=None, data=None, node=None):
    node = node or nodes[-1]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = requests.request(method, f"http://{node}{path}.json?ns={NAMESPACE}", headers=headers, data=data, timeout=30)
    return r.status_code


# A clean slate (the script may run twice against one cluster).
existing = [u.uid for u in auth.list_users(app=app).iterate_all()]
if existing:
    auth.delete_users(existing, app=app)

# create, get by uid and by email (in another letter case)
ada = auth.create_user(uid="ada", email="ada@example.com", password="lovelace1", display_name="Ada", app=app)
check("create_user uid", ada.uid, "ada")
got = auth.get_user("ada", app=app)
check("get_user", (got.email, got.display_name, got.disabled, got.email_verified), ("ada@example.com", "Ada", False, False))
check("get_user provider data", [p.provider_id for p in got.provider_data], ["password"])
check("get_user_by_email (case-insensitive)", auth.get_user_by_email("ADA@example.com", app=app).uid, "ada")
check("creation time is recent", abs(got.user_metadata.creation_timestamp / 1000 - time.time()) < 120, True)
raises("a second account with the same email", auth.EmailAlreadyExistsError, lambda: auth.create_user(email="Ada@Example.com", password="x" * 8, app=app))
raises("a second account with the same uid", auth.UidAlreadyExistsError, lambda: auth.create_user(uid="ada", app=app))
raises("get_user of a missing uid", auth.UserNotFoundError, lambda: auth.get_user("nobody", app=app))
raises("get_user_by_email of a missing email", auth.UserNotFoundError, lambda: auth.get_user_by_email("nobody@example.com", app=app))
status, answer = admin_toolkit(nodes[0], "accounts", {"email": "weak@example.com", "password": "123"})
check("a weak password (the server's answer)", (status, error_code(answer)), (400, "WEAK_PASSWORD"))

# update: password, email, display name, disabled; custom claims
auth.update_user("ada", email="ada@banyan.test", password="analytical2", display_name="Countess", disabled=False, app=app)
got = auth.get_user("ada", app=app)
check("update_user", (got.email, got.display_name, got.disabled), ("ada@banyan.test", "Countess", False))
raises("the old email is free of ada", auth.UserNotFoundError, lambda: auth.get_user_by_email("ada@example.com", app=app))
auth.set_custom_user_claims("ada", {"role": "admin", "level": 3}, app=app)
check("custom claims", auth.get_user("ada", app=app).custom_claims, {"role": "admin", "level": 3})
status, answer = admin_toolkit(nodes[0], "accounts:update", {"localId": "ada", "customAttributes": '{"sub":"x"}'})
check("a reserved claim is refused (the server's answer)", (status, error_code(answer)), (400, "FORBIDDEN_CLAIM"))

# more users, listed in pages
auth.create_user(uid="grace", email="grace@example.com", password="cobol1959", app=app)
auth.create_user(uid="alan", app=app)
auth.create_user(uid="edsger", email="edsger@example.com", app=app)
listed = sorted(u.uid for u in auth.list_users(max_results=2, app=app).iterate_all())
check("list_users in pages of 2", listed, ["ada", "alan", "edsger", "grace"])
page = auth.list_users(max_results=3, app=app)
check("a first page of 3 says more follow", (len(page.users), page.has_next_page), (3, True))
found = auth.get_users([auth.UidIdentifier("grace"), auth.EmailIdentifier("ada@banyan.test"), auth.UidIdentifier("ghost")], app=app)
check("get_users", (sorted(u.uid for u in found.users), len(found.not_found)), (["ada", "grace"], 1))

# a custom token, exchanged through another node
custom = auth.create_custom_token("grace", {"team": "navy"}, app=app)
status, answer = toolkit(nodes[1 % len(nodes)], "signInWithCustomToken", {"token": custom.decode(), "returnSecureToken": True})
check("signInWithCustomToken", (status, answer.get("isNewUser")), (200, False))
claims = auth.verify_id_token(answer.get("idToken", ""), app=app)
check("verify_id_token (custom token)", (claims["uid"], claims.get("team"), claims["firebase"]["sign_in_provider"]), ("grace", "navy", "custom"))
status, answer = toolkit(nodes[1 % len(nodes)], "signInWithCustomToken", {"token": auth.create_custom_token("newcomer", app=app).decode()})
check("a custom token for a new uid makes the account", (status, answer.get("isNewUser")), (200, True))
check("the new account exists", auth.get_user("newcomer", app=app).uid, "newcomer")

# sign in with the new password, through the last node
status, answer = toolkit(nodes[-1], "signInWithPassword", {"email": "Ada@Banyan.test", "password": "analytical2", "returnSecureToken": True})
check("signInWithPassword", (status, answer.get("localId")), (200, "ada"))
ada_token = answer.get("idToken", "")
ada_refresh = answer.get("refreshToken", "")
claims = auth.verify_id_token(ada_token, app=app)
check("verify_id_token (password)", (claims["uid"], claims.get("email"), claims.get("role"), claims["firebase"]["sign_in_provider"]),
      ("ada", "ada@banyan.test", "admin", "password"))
check("the sign-in was recorded", auth.get_user("ada", app=app).user_metadata.last_sign_in_timestamp is not None, True)
status, answer = toolkit(nodes[-1], "signInWithPassword", {"email": "ada@banyan.test", "password": "lovelace1"})
check("the old password is refused", (status, error_code(answer)), (400, "INVALID_PASSWORD"))
status, answer = toolkit(nodes[-1], "signInWithPassword", {"email": "nobody@banyan.test", "password": "whatever1"})
check("an unknown email", (status, error_code(answer)), (400, "EMAIL_NOT_FOUND"))

# database requests with those tokens, as the rules say
rules = """{"rules": {
  "users": {"$uid": {".read": "auth != null && auth.uid == $uid", ".write": "auth != null && auth.uid == $uid"}},
  "admin": {".read": "auth != null && auth.token.role == 'admin'"},
  "teams": {"$team": {".read": "auth != null && auth.token.team == $team"}}
}}"""
r = requests.put(f"http://{nodes[0]}/.settings/rules.json?ns={NAMESPACE}", data=rules, headers={"Authorization": "Bearer owner"}, timeout=30)
check("rules set", r.status_code, 200)
check("a user writes its own data", db("PUT", "/users/ada", ada_token, '{"name":"Ada"}'), 200)
check("a user reads its own data", db("GET", "/users/ada", ada_token), 200)
check("a user may not write another's data", db("PUT", "/users/grace", ada_token, '{"name":"not Grace"}'), 401)
check("a user may not read another's data", db("GET", "/users/grace", ada_token), 401)
check("no token: denied", db("GET", "/users/ada"), 401)
# A token whose claims were changed under ada's signature.
head, payload, signature = ada_token.split(".")
forged_claims = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).replace(b'"ada"', b'"grace"')
forged = ".".join([head, base64.urlsafe_b64encode(forged_claims).rstrip(b"=").decode(), signature])
check("a forged token: denied", db("GET", "/users/grace", forged), 401)
# Another project: only an administrator may keep accounts there, and the database does not
# honour its tokens even for the same uid and email.
r = requests.post(f"http://{nodes[0]}/identitytoolkit.googleapis.com/v1/projects/{OTHER_PROJECT}/accounts:signUp?key=fake-api-key",
                  json={"email": "ada@banyan.test", "password": "whatever1"}, timeout=30)
check("sign-up in a project the node does not serve", (r.status_code, error_code(r.json())), (400, "INVALID_PROJECT_ID"))
admin_toolkit(nodes[0], "accounts:delete", {"localId": "ada"}, project=OTHER_PROJECT)
status, answer = admin_toolkit(nodes[0], "accounts", {"localId": "ada", "email": "ada@banyan.test", "password": "whatever1"}, project=OTHER_PROJECT)
check("an administrator makes an account in another project", status, 200)
status, answer = admin_toolkit(nodes[0], "accounts:signInWithPassword", {"email": "ada@banyan.test", "password": "whatever1"}, project=OTHER_PROJECT)
other_token = answer.get("idToken", "")
check("its sign-in yields a token", (status, bool(other_token)), (200, True))
check("another project's token: denied", db("GET", "/users/ada", other_token), 401)
check("a custom claim grants a read", db("GET", "/admin", ada_token), 200)
grace_token = toolkit(nodes[0], "signInWithCustomToken", {"token": auth.create_custom_token("grace", {"team": "navy"}, app=app).decode()})[1]["idToken"]
check("a claim of the custom token grants a read", db("GET", "/teams/navy", grace_token), 200)
check("... and only where the rules say", db("GET", "/teams/army", grace_token), 401)
check("grace lacks ada's claim", db("GET", "/admin", grace_token), 401)
check("a forged token is refused", db("GET", "/users/ada", ada_token[:-4] + "AAAA"), 401)

# refresh, then revocation by a password change
status, answer = refresh(nodes[1 % len(nodes)], ada_refresh)
check("refresh", (status, answer.get("user_id")), (200, "ada"))
check("the refreshed token is honoured", db("GET", "/users/ada", answer.get("id_token")), 200)
time.sleep(1.1)  # validSince has a second's resolution, as in Firebase
auth.update_user("ada", password="difference3", app=app)
status, answer = refresh(nodes[1 % len(nodes)], ada_refresh)
check("a password change ends refresh tokens", (status, error_code(answer)), (400, "INVALID_REFRESH_TOKEN"))

# a disabled user cannot sign in or refresh
status, answer = toolkit(nodes[0], "signInWithPassword", {"email": "grace@example.com", "password": "cobol1959"})
grace_refresh = answer.get("refreshToken", "")
auth.update_user("grace", disabled=True, app=app)
check("disabled", auth.get_user("grace", app=app).disabled, True)
status, answer = toolkit(nodes[-1], "signInWithPassword", {"email": "grace@example.com", "password": "cobol1959"})
check("a disabled user cannot sign in", (status, error_code(answer)), (400, "USER_DISABLED"))
status, answer = refresh(nodes[-1], grace_refresh)
check("a disabled user cannot refresh", (status, error_code(answer)), (400, "USER_DISABLED"))
raises("verify_id_token(check_revoked) of a disabled user", auth.UserDisabledError, lambda: auth.verify_id_token(grace_token, check_revoked=True, app=app))

# delete
auth.delete_user("ada", app=app)
raises("deleted", auth.UserNotFoundError, lambda: auth.get_user("ada", app=app))
raises("deleting a missing user", auth.UserNotFoundError, lambda: auth.delete_user("ada", app=app))
result = auth.delete_users(["grace", "alan", "edsger", "newcomer", "ghost"], app=app)
check("delete_users", (result.success_count, result.failure_count), (5, 0))
check("no users left", [u.uid for u in auth.list_users(app=app).iterate_all()], [])

finish("firebase-admin auth interop")
