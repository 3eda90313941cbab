"""What the Python interop scripts share: named checks that record failures, and the credential
that lets firebase-admin talk to an emulator (it sends `Bearer owner` itself)."""
import sys

from firebase_admin import credentials

failures = []


def check(name, got, want):
    if got != want:
        failures.append(f"{name}: got {got!r}, want {want!r}")
        print(f"FAIL {name}: got {got!r}, want {want!r}")
    else:
        print(f"ok   {name}")


def raises(name, exc_type, fn):
    """Checks that `fn()` raises `exc_type`."""
    try:
        fn()
    except exc_type as e:
        print(f"ok   {name} ({type(e).__name__})")
        return
    except Exception as e:  # noqa: BLE001
        failures.append(f"{name}: raised {type(e).__name__}: {e}")
        print(f"FAIL {name}: raised {type(e).__name__}: {e}")
        return
    failures.append(f"{name}: did not raise")
    print(f"FAIL {name}: did not raise")


def finish(label):
    """Exits 1 if any check failed."""
    if failures:
        print(f"{len(failures)} {label} checks failed")
        sys.exit(1)
    print(f"{label}: all checks passed")


class Anonymous(credentials.Base):
    """The emulator path sends `Bearer owner` itself; no Google credential is needed."""

    def get_credential(self):
        return None
