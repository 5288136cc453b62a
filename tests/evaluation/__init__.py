"""Tests for evaluation/."""
