"""integrate: turn cache-dit's model-integration skill into a program.

Stages, each consuming the frozen records of the one before:
gate -> analyzers -> decisions -> templates -> verify.
"""

__version__ = "0.1.0"
