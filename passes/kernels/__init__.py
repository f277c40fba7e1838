"""Kernel building and default schedules (CPU: ``cpu_schedule``)."""
