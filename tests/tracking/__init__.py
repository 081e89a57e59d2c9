"""MLflow tracking: the layout, reuse through the store, the ui, MLflow's own UI in a browser, concurrent writers."""
