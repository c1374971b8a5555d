"""Diagnostics of reasoning collapse: cross-scoring mutual-information proxies."""
