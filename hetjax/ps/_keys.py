"""The parameter server's messages on the key-value channel, by key.

Under a run's prefix:

* ``addr/server/S``, ``addr/worker/W``: transfer addresses.
* ``ticket/S``: a counter; a client takes ticket t (`Channel.increment`) and writes its request
  at ``req/S/t``; server S serves tickets in order and answers at ``ack/S/t``, which the client
  reads and deletes. Requests are JSON:

  - ``{'op': 'push', 'worker', 'version', 'number', 'specs', 'rows', 'loss'}``: a gradient
    computed at ``version``, offered on the worker's transport under ``number``; the ack says
    ``accepted`` (or ``reason``), the server's ``version`` after it and the push's ``staleness``.
  - ``{'op': 'pull', 'worker', 'min_version', 'min_clock'}``: answered once the server is at
    ``min_version`` or later and every running worker has pushed ``min_clock`` times (ssp),
    with the ``version`` offered, its ``number`` on the server's transport and the worker's
    ``clock`` (its pushes the server accepted).
  - ``{'op': 'stop', 'worker'}``: the worker is done; the server ends when all are.
* ``failed/S``: set by a server that stops on an error (its one-line reason), so clients waiting
  on it end with that reason instead of a timeout.
"""

SERVER_ADDRESS = 'addr/server/{}'
WORKER_ADDRESS = 'addr/worker/{}'
TICKET = 'ticket/{}'
REQUEST = 'req/{}/{}'
ACK = 'ack/{}/{}'
FAILED = 'failed/{}'
