"""The statistics: claim kinds, mixed models, trends across conditions, sequential boundaries, planning and power, probe resampling, edge cases and the shipped files' verdict snapshot."""
