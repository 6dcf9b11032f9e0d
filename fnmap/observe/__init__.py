"""What a user sees of a job: records, history, the report layer, plots, progress bars and call output."""
