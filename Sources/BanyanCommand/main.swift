print("banyan")
