"""A group's health: whether it still works, and how a failure is found and told.

* ``state.py``: :class:`GroupHealth`, the typed state each group owns and hands down;
* ``watchdog.py``: deadlines and the waits that honour them (``backoff.py``: the pauses
  between polls);
* ``faults.py``: notices between ranks that a peer has failed;
* ``fingerprint.py`` (+ ``_slots.c``): the agreement check that every rank made the same call;
* ``abort.py``: ending the whole job when one rank dies with an exception.

Nothing here imports a group: the groups call down into these modules, never the reverse.
"""
