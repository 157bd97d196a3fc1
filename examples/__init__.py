"""Small examples of using hetjax with your own code (each is run by the test suite)."""
