"""What a user sees of a job: records, history, cost, plots, progress bars and call output."""
