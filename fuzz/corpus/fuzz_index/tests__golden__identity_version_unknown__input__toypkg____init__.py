"""No version here."""
