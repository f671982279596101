"""The training run's signal handlers (orchestration.run.install_signal_handlers), installed in this process's main thread."""

import signal

from orchestration.run import _raise_terminated, install_signal_handlers


def test_sigterm_is_ours_and_an_ignored_sigint_is_restored():
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as ray.init leaves it (its handler lives below Python)
        install_signal_handlers()
        assert signal.getsignal(signal.SIGTERM) is _raise_terminated
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        custom = lambda *_: None  # noqa: E731 - a handler the embedding program chose stays
        signal.signal(signal.SIGINT, custom)
        install_signal_handlers()
        assert signal.getsignal(signal.SIGINT) is custom
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])
