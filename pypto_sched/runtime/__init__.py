"""The runtime: the backend contract and discovery, the driver, generate, verification,
sampling, prompt files, chat templates and the output writer."""
