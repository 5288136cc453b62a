"""Tests of the operations layer: Prefect deployments and schedules."""
