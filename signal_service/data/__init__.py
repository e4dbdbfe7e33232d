"""Grid traces the replay feed plays (gb_2020_carbon_intensity.csv: GB, 2020, half-hourly;
de_2020_carbon_intensity.csv: Germany, 2020, quarter-hourly, same source and columns, the second
region of the carbon bench's spatial evaluation), and a
week of forecasts a real feed issued with the values that came (uk_national_2023-03_forecasts.csv,
`issued_at,target,forecast`, and uk_national_2023-03_actuals.csv, `target,actual`: 47 national
48 h forecasts of the UK Carbon Intensity API, 14 to 19 March 2023, as scraped by
nmpowell/carbon-intensity-forecast-tracking; data: National Grid ESO Carbon Intensity API, CC BY 4.0)."""
