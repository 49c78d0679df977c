"""edgepop: edge AI inference research toolkit.

The importable subsystems live in the top-level packages ``topology``, ``controlplane``, ``dataplane`` and
``sim``; this package holds only the command-line entry point and the shared error type.
"""

__version__ = "0.1.0"
