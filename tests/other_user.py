"""A second unix user of this host, for tests of what another local user can plant.

:func:`other_user` creates (once) a real unprivileged account, ``spark-keras-other``,
with ``useradd``; tests make files and folders owned by it (``os.chown`` as root, or
:func:`as_other_user` to run a command as that user). It needs root to create the account
or an account of that name made beforehand; without either the tests that use it skip
with the reason.
"""

from __future__ import annotations

import os
import pwd
import subprocess

import pytest

NAME = "spark-keras-other"


def other_user() -> pwd.struct_passwd:
    """The second user's passwd entry, the account created if it does not exist."""
    try:
        return pwd.getpwnam(NAME)
    except KeyError:
        pass
    if os.geteuid() != 0:
        pytest.skip(f"needs root to create the second user {NAME!r} (or that account made beforehand)")
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
                   check=True, capture_output=True)
    return pwd.getpwnam(NAME)


def give_to_other_user(path: str | os.PathLike[str]) -> None:
    """Make ``path`` and everything under it owned by the second user (needs root)."""
    user = other_user()
    if os.geteuid() != 0:
        pytest.skip("needs root to give files to another user")
    for root, folders, files in os.walk(path):
        os.chown(root, user.pw_uid, user.pw_gid, follow_symlinks=False)
        for name in folders + files:
            os.chown(os.path.join(root, name), user.pw_uid, user.pw_gid, follow_symlinks=False)
    if not os.path.isdir(path):
        os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)


def as_other_user(*command: str, **kwargs) -> subprocess.CompletedProcess:
    """Run ``command`` as the second user (``setpriv``-like: its uid and gid, no groups)."""
    user = other_user()

    def drop() -> None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    return subprocess.run(list(command), preexec_fn=drop, check=True, capture_output=True,
                          **kwargs)
