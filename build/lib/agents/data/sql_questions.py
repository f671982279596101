"""Hand-written question / gold-SQL pairs for the SQL task databases (agents layer: pure data).

Every gold query runs on its database and returns at least one row (a test checks all of them).
"""

from __future__ import annotations

# (question, gold SQL) for the synthetic insurance database (agents/data/insurance_db.py).
INSURANCE: tuple[tuple[str, str], ...] = (
    ("How many customers are there?", "SELECT COUNT(*) FROM customer"),
    ("How many policies are there of each policy type?",
     "SELECT policy_type, COUNT(*) AS n FROM policy GROUP BY policy_type"),
    ("List the first and last names of the customers who live in Austin, sorted by last name and then first name.",
     "SELECT first_name, last_name FROM customer WHERE city = 'Austin' ORDER BY last_name, first_name"),
    ("What is the total annual premium of all active policies?",
     "SELECT SUM(annual_premium) FROM policy WHERE status = 'active'"),
    ("What is the average claimed amount for each incident type, highest average first?",
     "SELECT incident_type, AVG(claimed_amount) AS avg_claimed FROM claim GROUP BY incident_type "
     "ORDER BY avg_claimed DESC"),
    ("Which five customers hold the most policies? Give id, first name, last name and the number of policies; "
     "break ties by customer id.",
     "SELECT c.customer_id, c.first_name, c.last_name, COUNT(p.policy_id) AS n_policies FROM customer c "
     "JOIN policy p ON p.customer_id = c.customer_id GROUP BY c.customer_id "
     "ORDER BY n_policies DESC, c.customer_id LIMIT 5"),
    ("How many claims were denied?", "SELECT COUNT(*) FROM claim WHERE status = 'denied'"),
    ("What is the total amount paid out with each payment method, in alphabetical order of method?",
     "SELECT method, SUM(amount) AS total FROM claim_payment GROUP BY method ORDER BY method"),
    ("Which claims were paid in more than one payment? Give the claim id and the number of payments, by claim id.",
     "SELECT claim_id, COUNT(*) AS n_payments FROM claim_payment GROUP BY claim_id HAVING COUNT(*) > 1 "
     "ORDER BY claim_id"),
    ("How many claims were filed in each year? Order by year.",
     "SELECT strftime('%Y', claim_date) AS year, COUNT(*) AS n FROM claim GROUP BY year ORDER BY year"),
    ("How many customers have never filed a claim on any of their policies?",
     "SELECT COUNT(*) FROM customer WHERE customer_id NOT IN "
     "(SELECT p.customer_id FROM policy p JOIN claim cl ON cl.policy_id = p.policy_id)"),
    ("Which claim has the largest claimed amount? Give the claim id, the amount and the customer's first and last name.",
     "SELECT cl.claim_id, cl.claimed_amount, c.first_name, c.last_name FROM claim cl "
     "JOIN policy p ON p.policy_id = cl.policy_id JOIN customer c ON c.customer_id = p.customer_id "
     "ORDER BY cl.claimed_amount DESC LIMIT 1"),
    ("What is the total amount of claim payments received by customers in each state, largest total first?",
     "SELECT c.state, SUM(cp.amount) AS total_paid FROM claim_payment cp "
     "JOIN claim cl ON cl.claim_id = cp.claim_id JOIN policy p ON p.policy_id = cl.policy_id "
     "JOIN customer c ON c.customer_id = p.customer_id GROUP BY c.state ORDER BY total_paid DESC"),
    ("How many policies started during 2021?",
     "SELECT COUNT(*) FROM policy WHERE start_date BETWEEN '2021-01-01' AND '2021-12-31'"),
    ("What is the average annual premium for each policy type, rounded to two decimals, by policy type?",
     "SELECT policy_type, ROUND(AVG(annual_premium), 2) AS avg_premium FROM policy GROUP BY policy_type "
     "ORDER BY policy_type"),
    ("For each claim status, how many claims are there and what is their total claimed amount?",
     "SELECT status, COUNT(*) AS n, SUM(claimed_amount) AS total_claimed FROM claim GROUP BY status"),
    ("List the home policies with a coverage amount above 500,000, largest coverage first.",
     "SELECT policy_id, coverage_amount FROM policy WHERE policy_type = 'home' AND coverage_amount > 500000 "
     "ORDER BY coverage_amount DESC"),
    ("Which customers born before 1970 hold a life policy? Give id, first and last name, by customer id.",
     "SELECT DISTINCT c.customer_id, c.first_name, c.last_name FROM customer c "
     "JOIN policy p ON p.customer_id = c.customer_id WHERE p.policy_type = 'life' "
     "AND c.date_of_birth < '1970-01-01' ORDER BY c.customer_id"),
    ("For each approved claim, how much of the claimed amount is still unpaid? Largest outstanding amount first.",
     "SELECT cl.claim_id, cl.claimed_amount - COALESCE(SUM(cp.amount), 0) AS outstanding FROM claim cl "
     "LEFT JOIN claim_payment cp ON cp.claim_id = cl.claim_id WHERE cl.status = 'approved' "
     "GROUP BY cl.claim_id ORDER BY outstanding DESC"),
    ("How many distinct cities do our customers live in?", "SELECT COUNT(DISTINCT city) FROM customer"),
    ("What is the email address of customer 42?", "SELECT email FROM customer WHERE customer_id = 42"),
    ("In which month (YYYY-MM) were the most claim payments made? Break ties by the earlier month.",
     "SELECT strftime('%Y-%m', payment_date) AS month, COUNT(*) AS n FROM claim_payment GROUP BY month "
     "ORDER BY n DESC, month LIMIT 1"),
    ("How many claims were filed against each policy type, most claims first?",
     "SELECT p.policy_type, COUNT(cl.claim_id) AS n_claims FROM policy p "
     "LEFT JOIN claim cl ON cl.policy_id = p.policy_id GROUP BY p.policy_type ORDER BY n_claims DESC"),
    ("Which three cities have the largest total annual premium over active policies?",
     "SELECT c.city, SUM(p.annual_premium) AS total_premium FROM customer c "
     "JOIN policy p ON p.customer_id = c.customer_id WHERE p.status = 'active' GROUP BY c.city "
     "ORDER BY total_premium DESC LIMIT 3"),
    ("Which policies that are not active have at least one claim that is still open?",
     "SELECT DISTINCT p.policy_id FROM policy p JOIN claim cl ON cl.policy_id = p.policy_id "
     "WHERE p.status <> 'active' AND cl.status = 'open' ORDER BY p.policy_id"),
    ("On average, how many days pass between a claim being filed and its first payment?",
     "SELECT AVG(julianday(f.first_payment) - julianday(cl.claim_date)) FROM claim cl "
     "JOIN (SELECT claim_id, MIN(payment_date) AS first_payment FROM claim_payment GROUP BY claim_id) f "
     "ON f.claim_id = cl.claim_id"),
    ("Which customers have received more than 20,000 in claim payments in total? Largest total first.",
     "SELECT c.customer_id, c.first_name, c.last_name, SUM(cp.amount) AS total_paid FROM customer c "
     "JOIN policy p ON p.customer_id = c.customer_id JOIN claim cl ON cl.policy_id = p.policy_id "
     "JOIN claim_payment cp ON cp.claim_id = cl.claim_id GROUP BY c.customer_id "
     "HAVING SUM(cp.amount) > 20000 ORDER BY total_paid DESC"),
    ("Which payment method was used most often for claims on travel policies?",
     "SELECT cp.method, COUNT(*) AS n FROM claim_payment cp JOIN claim cl ON cl.claim_id = cp.claim_id "
     "JOIN policy p ON p.policy_id = cl.policy_id WHERE p.policy_type = 'travel' GROUP BY cp.method "
     "ORDER BY n DESC LIMIT 1"),
)

# (question, gold SQL) for the Chinook database (agents/data/chinook_db.py, canonical table names).
CHINOOK: tuple[tuple[str, str], ...] = (
    ("How many tracks are in the catalogue?", "SELECT COUNT(*) FROM Track"),
    ("List the titles of all albums by AC/DC in alphabetical order.",
     "SELECT al.Title FROM Album al JOIN Artist ar ON ar.ArtistId = al.ArtistId WHERE ar.Name = 'AC/DC' "
     "ORDER BY al.Title"),
    ("How many tracks does each genre have? Most tracks first, ties by genre name.",
     "SELECT g.Name, COUNT(*) AS n_tracks FROM Track t JOIN Genre g ON g.GenreId = t.GenreId "
     "GROUP BY g.GenreId ORDER BY n_tracks DESC, g.Name"),
    ("Who are the five customers who spent the most? Give id, first name, last name and total spent.",
     "SELECT c.CustomerId, c.FirstName, c.LastName, SUM(i.Total) AS spent FROM Customer c "
     "JOIN Invoice i ON i.CustomerId = c.CustomerId GROUP BY c.CustomerId ORDER BY spent DESC LIMIT 5"),
    ("What are the total sales per billing country, highest first?",
     "SELECT BillingCountry, SUM(Total) AS sales FROM Invoice GROUP BY BillingCountry ORDER BY sales DESC"),
    ("Which employees have the title 'Sales Support Agent'? Give first and last names sorted by last name.",
     "SELECT FirstName, LastName FROM Employee WHERE Title = 'Sales Support Agent' ORDER BY LastName"),
    ("What is the longest track and how many milliseconds does it last?",
     "SELECT Name, Milliseconds FROM Track ORDER BY Milliseconds DESC LIMIT 1"),
    ("What is the average track length in seconds for each media type?",
     "SELECT m.Name, AVG(t.Milliseconds) / 1000.0 AS avg_seconds FROM Track t "
     "JOIN MediaType m ON m.MediaTypeId = t.MediaTypeId GROUP BY m.MediaTypeId"),
    ("Which artists have more than ten albums? Most albums first.",
     "SELECT ar.Name, COUNT(*) AS n_albums FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId "
     "GROUP BY ar.ArtistId HAVING COUNT(*) > 10 ORDER BY n_albums DESC"),
    ("How many invoices were issued in each year? Order by year.",
     "SELECT strftime('%Y', InvoiceDate) AS year, COUNT(*) AS n FROM Invoice GROUP BY year ORDER BY year"),
    ("How many customers does each support representative look after? Give the rep's name, most customers first.",
     "SELECT e.FirstName, e.LastName, COUNT(c.CustomerId) AS n_customers FROM Employee e "
     "JOIN Customer c ON c.SupportRepId = e.EmployeeId GROUP BY e.EmployeeId ORDER BY n_customers DESC"),
    ("Which tracks are on the playlist called 'Grunge'? Alphabetical order.",
     "SELECT t.Name FROM Playlist p JOIN PlaylistTrack pt ON pt.PlaylistId = p.PlaylistId "
     "JOIN Track t ON t.TrackId = pt.TrackId WHERE p.Name = 'Grunge' ORDER BY t.Name"),
    ("Which genre brought in the most revenue, and how much?",
     "SELECT g.Name, SUM(il.UnitPrice * il.Quantity) AS revenue FROM InvoiceLine il "
     "JOIN Track t ON t.TrackId = il.TrackId JOIN Genre g ON g.GenreId = t.GenreId GROUP BY g.GenreId "
     "ORDER BY revenue DESC LIMIT 1"),
    ("List the first name, last name and city of customers in Brazil, sorted by last name.",
     "SELECT FirstName, LastName, City FROM Customer WHERE Country = 'Brazil' ORDER BY LastName"),
    ("How many tracks have no composer listed?", "SELECT COUNT(*) FROM Track WHERE Composer IS NULL"),
    ("For every employee who has a manager, who is that manager? Give both full names, by employee id.",
     "SELECT e.FirstName || ' ' || e.LastName AS employee, m.FirstName || ' ' || m.LastName AS manager "
     "FROM Employee e JOIN Employee m ON m.EmployeeId = e.ReportsTo ORDER BY e.EmployeeId"),
    ("Which albums last longer than one hour in total? Give the title and length in minutes, longest first.",
     "SELECT al.Title, SUM(t.Milliseconds) / 60000.0 AS minutes FROM Album al "
     "JOIN Track t ON t.AlbumId = al.AlbumId GROUP BY al.AlbumId HAVING SUM(t.Milliseconds) > 3600000 "
     "ORDER BY minutes DESC"),
    ("How many different customers have bought at least one Jazz track?",
     "SELECT COUNT(DISTINCT i.CustomerId) FROM Invoice i JOIN InvoiceLine il ON il.InvoiceId = i.InvoiceId "
     "JOIN Track t ON t.TrackId = il.TrackId JOIN Genre g ON g.GenreId = t.GenreId WHERE g.Name = 'Jazz'"),
    ("What is the average invoice total for customers of each country, rounded to two decimals, highest first?",
     "SELECT c.Country, ROUND(AVG(i.Total), 2) AS avg_total FROM Customer c "
     "JOIN Invoice i ON i.CustomerId = c.CustomerId GROUP BY c.Country ORDER BY avg_total DESC"),
    ("How many tracks does each playlist contain? Largest playlists first, ties by name.",
     "SELECT p.Name, COUNT(pt.TrackId) AS n_tracks FROM Playlist p "
     "LEFT JOIN PlaylistTrack pt ON pt.PlaylistId = p.PlaylistId GROUP BY p.PlaylistId "
     "ORDER BY n_tracks DESC, p.Name"),
    ("How many tracks have never been sold?",
     "SELECT COUNT(*) FROM Track WHERE TrackId NOT IN (SELECT TrackId FROM InvoiceLine)"),
    ("Which artist has earned the most from track sales?",
     "SELECT ar.Name, SUM(il.UnitPrice * il.Quantity) AS revenue FROM InvoiceLine il "
     "JOIN Track t ON t.TrackId = il.TrackId JOIN Album al ON al.AlbumId = t.AlbumId "
     "JOIN Artist ar ON ar.ArtistId = al.ArtistId GROUP BY ar.ArtistId ORDER BY revenue DESC LIMIT 1"),
    ("What was the revenue in each month of 2009? Order by month.",
     "SELECT strftime('%m', InvoiceDate) AS month, SUM(Total) AS revenue FROM Invoice "
     "WHERE strftime('%Y', InvoiceDate) = '2009' GROUP BY month ORDER BY month"),
    ("What are the total sales of the customers of each support representative, highest first?",
     "SELECT e.FirstName, e.LastName, SUM(i.Total) AS sales FROM Employee e "
     "JOIN Customer c ON c.SupportRepId = e.EmployeeId JOIN Invoice i ON i.CustomerId = c.CustomerId "
     "GROUP BY e.EmployeeId ORDER BY sales DESC"),
    ("List the names of all tracks by Queen in alphabetical order.",
     "SELECT t.Name FROM Track t JOIN Album al ON al.AlbumId = t.AlbumId "
     "JOIN Artist ar ON ar.ArtistId = al.ArtistId WHERE ar.Name = 'Queen' ORDER BY t.Name"),
    ("How many tracks are sold at each unit price? Order by price.",
     "SELECT UnitPrice, COUNT(*) AS n FROM Track GROUP BY UnitPrice ORDER BY UnitPrice"),
    ("How many customers have a company name on file?",
     "SELECT COUNT(*) FROM Customer WHERE Company IS NOT NULL"),
    ("Which track was bought the most times, counting quantity? Break ties by track name.",
     "SELECT t.Name, SUM(il.Quantity) AS times_bought FROM InvoiceLine il JOIN Track t ON t.TrackId = il.TrackId "
     "GROUP BY t.TrackId ORDER BY times_bought DESC, t.Name LIMIT 1"),
)

QUESTIONS: dict[str, tuple[tuple[str, str], ...]] = {"insurance": INSURANCE, "chinook": CHINOOK}
