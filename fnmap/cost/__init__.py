"""What jobs cost at list prices: prices, the price of an attempt and of a job, the estimate of a map
before it runs, and the cost cap while it runs.  Nothing is imported here: the scheduler loads :mod:`.budget` alone."""
