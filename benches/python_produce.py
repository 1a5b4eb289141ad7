"""What an application on the official Python client sees: THREADS threads
share one Producer (rocketmq-python-client 5.1.2, unmodified) and send
1 KiB messages, each waiting for its receipt, for SECONDS seconds.

    target/tmp/python-venv/bin/python benches/python_produce.py \
        '127.0.0.1:8081;127.0.0.1:8082;127.0.0.1:8083' [THREADS] [SECONDS] [TOPIC]

Prints one JSON line: ok, errors, msgs_per_s, p50_ms, p99_ms, max_ms.
The venv is the one .ci/run makes for tests/python_client.rs.
"""

import json
import sys
import threading
import time

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def main():
    endpoints = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10
    topic = sys.argv[4] if len(sys.argv) > 4 else "TestTopic"
    if not 1 <= threads <= 256 or not 0 < seconds <= 600:
        sys.exit("THREADS must be 1..256 and SECONDS 1..600")
    producer = Producer(ClientConfiguration(endpoints, Credentials("ak", "sk"), request_timeout=5), (topic,))
    producer.startup()
    body = b"x" * 1024
    lock = threading.Lock()
    latencies, errors = [], [0]
    deadline = time.monotonic() + seconds

    def sender():
        mine, failed = [], 0
        while time.monotonic() < deadline:
            m = Message()
            m.topic = topic
            m.body = body
            t = time.monotonic()
            try:
                producer.send(m)
                mine.append(time.monotonic() - t)
            except Exception:
                failed += 1
        with lock:
            latencies.extend(mine)
            errors[0] += failed

    started = time.monotonic()
    workers = [threading.Thread(target=sender) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.monotonic() - started
    producer.shutdown()
    latencies.sort()

    def pct(p):
        return latencies[round((len(latencies) - 1) * p)] * 1000 if latencies else 0.0

    print(json.dumps({
        "ok": len(latencies),
        "errors": errors[0],
        "msgs_per_s": len(latencies) / elapsed,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "max_ms": latencies[-1] * 1000 if latencies else 0.0,
    }))


if __name__ == "__main__":
    main()
