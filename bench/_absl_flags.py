"""A pytest plugin for ``--tpu-ci`` runs: parses absl's flags before the tests run, as the
``absltest.main()`` that the CI's ``python3 FILE`` would call does. Under pytest nobody parses
them, and a test reading a flag (``absltest``'s ``create_tempdir`` reads ``--test_tmpdir``)
fails with ``UnparsedFlagAccessError`` - a failure of the harness, not of the program tested."""

from __future__ import annotations

import sys


def pytest_configure(config: object) -> None:
    try:
        from absl import flags
    except ImportError:  # the file cannot use absl either
        return
    if not flags.FLAGS.is_parsed():
        # the program's own name only: pytest's arguments are not the program's flags
        flags.FLAGS(sys.argv[:1], known_only=True)
