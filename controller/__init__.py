"""The SLO controller: policies over REST, a pure decision core, and adapters for I/O."""
