"""The process contract between the server and the load generator, owned in one place.

Both sides import it; it imports neither torch nor ``netgain.server`` / ``netgain.loadgen``:

- ``phases``: the phase names, the metadata keys and the ``server-timing`` trailer format;
- ``records``: the request-record columns of ``requests.parquet`` (and the samples' columns);
- ``messages``: the names of the messages between the load master, its workers and their senders;
- ``rundir``: the run directory's file names and schema version, writing and reading
  ``meta.json`` and ``report.json`` with the version checked;
- ``payloads``: request payloads of the built-in models (pillow, numpy and the standard library).
"""
