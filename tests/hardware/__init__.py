"""Tests that need a real Coral USB Accelerator (see conftest.py)."""
