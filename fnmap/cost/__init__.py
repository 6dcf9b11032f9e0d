"""What jobs cost at list prices: the prices (:mod:`.prices`, and :mod:`.fetch`, which asks AWS's
Price List API for current ones), the price of an attempt and of a finished job (:mod:`.pricing`),
what a map will cost before it runs (:mod:`.forecast`) and the cost cap while it runs (:mod:`.budget`).

Nothing is imported here: the scheduler loads :mod:`.budget` alone, without the storage reads
the forecast makes."""
