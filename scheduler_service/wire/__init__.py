"""Proto <-> domain at the edge: requests validated into domain values (inbound), rows sent as
proto messages (outbound). May import domain and rows only."""
