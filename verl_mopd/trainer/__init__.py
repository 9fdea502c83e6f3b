"""Driver-side integration with verl's v1 trainer (TransferQueue-backed)."""
