"""What scan and verify share: errors and exit codes, choices, the results envelope and its
writer, statistics, the resource timeline, and process supervision."""
