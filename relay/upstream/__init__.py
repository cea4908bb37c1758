"""The relay's single Delta-ADS stream to its origin."""
