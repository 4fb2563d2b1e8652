"""netgain load side: traces, the open-loop load generator on Locust, and the aggregator."""
