hsap-plan --dist longtail --T 16384 --P 8     # add --png plan.png for the token map and the traffic
