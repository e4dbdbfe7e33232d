"""Grid traces the replay feed plays (gb_2020_carbon_intensity.csv: GB, 2020, half-hourly)."""
