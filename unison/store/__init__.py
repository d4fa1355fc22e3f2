"""The rendezvous store: control plane only, never tensor data.

* :class:`Store` - the interface (set/get/add/compare_set/wait/check/delete).
* :class:`TCPStoreServer` / :class:`TCPStore` - HMAC-authenticated TCP store.
* :class:`FileStore` - a directory, for launchers that give no store address.
* :class:`PrefixStore` - namespacing over any of them.
"""

from .base import Store
from .client import TCPStore
from .file import FileStore
from .prefix import PrefixStore
from .server import TCPStoreServer

__all__ = ["FileStore", "PrefixStore", "Store", "TCPStore", "TCPStoreServer"]
