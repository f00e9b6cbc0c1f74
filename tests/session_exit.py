"""The suite ends when its summary is printed, whatever a failed test left behind.

A thread stuck in a blocking call (a socket read with no timeout in an executor's thread, which the
interpreter joins at exit) keeps the interpreter from exiting after the summary: the run then hangs
until CI's time limit, with nothing printed to say why. At the session's end a watchdog is armed: if
the interpreter has not exited within EXIT_GRACE_S, it prints every thread's stack and exits with the
suite's status. (A process a test leaves running does not hold CI's output open: pytest captures each
test's file descriptors, so children inherit the capture files.)
"""

import faulthandler
import os
import sys
import threading

EXIT_GRACE_S = 60.0


def arm_exit_watchdog(exit_status: int) -> None:
    def watchdog() -> None:
        print(
            f"\nsession end: still running {EXIT_GRACE_S:.0f} s after the summary; the threads holding it:",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(all_threads=True)
        os._exit(exit_status)

    timer = threading.Timer(EXIT_GRACE_S, watchdog)
    timer.daemon = True
    timer.start()
