"""Starts a thread when imported: a daemon must not fork after preloading it."""

import threading
import time

threading.Thread(target=time.sleep, args=(3600,), name="preload-sleeper", daemon=True).start()
