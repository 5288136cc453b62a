"""Tests for agents/tools."""
