"""What the `anybit` command runs: formats table, bench, eval, tune."""
