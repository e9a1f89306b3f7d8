"""The service layer: every write the API makes goes through these functions."""
