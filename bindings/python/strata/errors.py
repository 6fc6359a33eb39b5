"""StrataError: every failed Strata call, with the library's code and message."""
from . import _lib

_NAMES = {
    _lib.E_INVALID: "STRATA_E_INVALID",
    _lib.E_BAD_HANDLE: "STRATA_E_BAD_HANDLE",
    _lib.E_STATE: "STRATA_E_STATE",
    _lib.E_NOMEM: "STRATA_E_NOMEM",
    _lib.E_PINNED_BUDGET: "STRATA_E_PINNED_BUDGET",
    _lib.E_DEVICE_BUDGET: "STRATA_E_DEVICE_BUDGET",
    _lib.E_NOSPACE: "STRATA_E_NOSPACE",
    _lib.E_IO: "STRATA_E_IO",
    _lib.E_CORRUPT: "STRATA_E_CORRUPT",
    _lib.E_UNSUPPORTED: "STRATA_E_UNSUPPORTED",
    _lib.E_DEVICE: "STRATA_E_DEVICE",
    _lib.E_LIMIT: "STRATA_E_LIMIT",
    _lib.E_TIMEOUT: "STRATA_E_TIMEOUT",
    _lib.E_INTERNAL: "STRATA_E_INTERNAL",
}


class StrataError(RuntimeError):
    """A Strata call failed.

    code: the negative STRATA_E_* value; name: its symbol ("STRATA_E_STATE"); strerror: the
    library's description of the code; message: what strata_last_error said (which call, which
    tensor, which numbers), or the binding's own explanation for errors found in Python.
    """

    def __init__(self, code, message):
        self.code = int(code)
        self.name = _NAMES.get(self.code, f"STRATA_E_{self.code}")
        raw = _lib.strata_strerror(self.code)
        self.strerror = raw.decode("utf-8", "replace") if raw else ""
        self.message = message
        super().__init__(f"{self.name} ({self.code}): {message}")


def code_name(code):
    return _NAMES.get(int(code), "STRATA_OK" if code == 0 else f"STRATA_E_{code}")


def check(rc, runtime_ptr=None, call=""):
    """Raises StrataError for a nonzero rc, with the runtime's last-error text."""
    if rc == _lib.OK:
        return
    text = _lib.strata_last_error(runtime_ptr)
    message = text.decode("utf-8", "replace") if text else ""
    if not message:
        raw = _lib.strata_strerror(rc)
        message = f"{call}: {raw.decode() if raw else 'failed'}"
    raise StrataError(rc, message)
