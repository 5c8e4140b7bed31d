"""Starts a native thread when imported, one Python's threading does not list and no fork
handler stops (it waits in ``pause()``; any lock it held would stay locked in a forked
child). It keeps the main thread's name, as OpenBLAS's threads do: a daemon must not fork
after preloading it."""

import ctypes

_libc = ctypes.CDLL(None, use_errno=True)
_thread = ctypes.c_ulong()
# pause() as the start routine: it never returns, never touches Python
_err = _libc.pthread_create(ctypes.byref(_thread), None, ctypes.cast(_libc.pause, ctypes.c_void_p),
                            None)
if _err:
    raise OSError(_err, "pthread_create failed")
