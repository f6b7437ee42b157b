"""moto's S3 server for the tests, one request at a time.

    python tests/s3_server.py PORT

moto's own launcher handles requests on threads and checks a conditional write's
precondition and then writes, as two steps: two racing ``If-Match`` writes can both pass.
Real S3 (and MinIO, R2, Ceph) make the check and the write one atomic step, and the
concurrency tests need that, so this serves moto's application with each request handled
whole under one lock (connections still on threads, so keep-alive clients do not block).
"""

import sys
import threading

from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

LOCK = threading.Lock()
moto_app = DomainDispatcherApplication(create_backend_app)


def one_at_a_time(environ, start_response):
    with LOCK:
        return list(moto_app(environ, start_response))


if __name__ == "__main__":
    run_simple("127.0.0.1", int(sys.argv[1]), one_at_a_time, threaded=True, request_handler=MotoRequestHandler)
