"""The pure planning core: config, rules, offline engines, online state, the page pool,
generation planning, the schedule and its arrays. No I/O, clock, environment or device."""
